"""The gateway's HTTP face: blueprints, the stream side's error-to-status table and the app
factory. The server they run on is the top-level `server` package. Nothing below pep/http knows
about Flask."""
