"""The gateway's HTTP edge: blueprints, the one error-to-status table, the app factory and the
server. Nothing below pep/http knows about Flask."""
