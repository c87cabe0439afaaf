"""What the PDP, the stream side and the proxy share that is not the PDP: who a caller is, how
numbers and documents from outside are read, how a refusal is said, where state is kept.

- identities: `auth` (bearer tokens, the auth file, the `Identity` a request is decided as),
  `roles` (role hierarchies), `oidc/` (JWT bearer tokens from an OIDC issuer);
- reading input: `numbers` (the one parser of numbers from outside), `xmlsafe` (hardened XML and
  JSON loading);
- refusing: `refusals` (the kinds of refusal both sides raise, never HTTP statuses);
- keeping state: `db` (the `Database` seam, SQLite, the choice of store), `postgres`,
  `migrations` (each store's versioned schema);
- talking to caching proxies: `invalidation` (the protocol's events, ids and signatures);
- the command line: `pipes` (a reader gone ends a program quietly);
- `http/` (Flask only here): request authentication (`auth`), the one JSON error body and the
  table of the shared kinds (`errors`), the bounded JSON parser for request bodies
  (`safe_json`).

`common` imports nothing of `pdp`, `pep`, `proxy` or `server`, and Flask only under
`common/http` (`tests/test_layout.py`).
"""
