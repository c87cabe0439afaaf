"""The settings table: every field of `GatewayConfig` and of `OidcSettings` (as `oidc.*`) is a
setting, with its help, its default as `--help` shows it, its file key, its environment variable
(XSG_<SETTING>) and its flag. One field added to GatewayConfig is at once all of these."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from pep.config.model import GatewayConfig
from pep.config.validation import KINDS

SERVE_DEFAULTS: dict[str, Any] = {"start_spark": True}  # `xsg serve` pays Spark's start-up first

FLAG_NAMES = {"auth_file": "--auth", "root_combining_alg": "--root-combining",
              "root_policy_id": "--root-policy", "policies_dir": "--policies",
              "spark_conf": "--conf", "oidc.attributes": "--oidc-attribute"}
# the store's URL may carry a password
SECRET_SETTINGS = frozenset({"proxy_token", "proxy_secret", "read_token_key", "store",
                             "delivery_password"})

SETTING_HELP = {
    "host": "interface to listen on",
    "port": "TCP port (0: any free port)",
    "data_dir": "where the policy store, catalogue, handles and audit trail live (with a "
                "PostgreSQL store: the ingest files, Spark's work and the demo tokens)",
    "store": "where policies, streams, handles, events, privacy budgets and the audit trail are "
             "kept: empty for SQLite files under data_dir, or postgresql://USER@HOST:PORT/DB "
             "(a secret when it holds a password: prefer the environment or the file to a "
             "flag)",
    "store_pool_size": "connections to the PostgreSQL store this process keeps at most",
    "store_timeout": "seconds to wait for a connection to the PostgreSQL store before "
                     "answering 503 (at start: before giving up)",
    "cluster": "one of several gateway processes started on the same PostgreSQL store and "
               "data_dir, serving as one gateway (each stream served by one of them)",
    "advertise_url": "the URL at which the other processes of the cluster reach this one",
    "lease_seconds": "seconds a process's hold on its streams lasts without renewal: a process "
                     "that dies has its streams taken over after about this long",
    "auth_file": "token file: JSON list of {token, subject, roles, admin, attributes}, or "
                 "{tokens: that list, role_hierarchy: {role: [roles it inherits]}}; re-read "
                 "when it changes and on SIGHUP",
    "root_combining_alg": "policy-combining algorithm at the root (short name or full URI)",
    "root_policy_id": "use this stored PolicySet as the root",
    "policies_dir": "seed an empty store (and the stream catalogue) from this directory",
    "seed_owner": "recorded as the writer of the seeded policies",
    "spark_master": "Spark master URL",
    "base_url": "public URL of the gateway (for handle URIs)",
    "max_content_length": "largest request body, in bytes",
    "threads": "threads that run routes, started with the server and kept",
    "max_threads": "ceiling of that pool: routes running at once (bodies, idle connections "
                   "and handle readers hold no thread)",
    "max_connections": "open connections at once; more are answered 429",
    "max_readers_per_subject": "handle streams one subject may read at once; more are "
                               "answered 429",
    "idle_timeout": "seconds a connection may sit idle before or between requests",
    "write_timeout": "seconds a write to a client may make no progress before its connection "
                     "is closed (a handle reader may resume with Last-Event-ID)",
    "header_timeout": "seconds a request head may take from its first byte (then 408)",
    "min_body_rate": "bytes/s a request body must average once header_timeout seconds have "
                     "passed (then 408; 0: no minimum)",
    "tls_cert": "serve HTTPS with this PEM certificate (chain); needs tls_key",
    "tls_key": "the PEM private key of tls_cert",
    "forwarded_allow_ips": "comma-separated addresses or networks of reverse proxies whose "
                           "X-Forwarded-For and X-Forwarded-Proto are trusted",
    "start_spark": "start Spark before serving (else with the first handle)",
    "reevaluation_interval": "seconds between re-decisions of time-dependent grants",
    "trigger_interval": "seconds between a stream query's micro-batches",
    "shared_query": "serve every ingest stream of this process on one shared query, one Spark "
                    "job per micro-batch for all of them (many busy streams); other streams "
                    "keep a query of their own",
    "shared_trigger_min": "seconds between the shared query's micro-batches at the shortest "
                          "(one busy stream)",
    "shared_trigger_max": "seconds between the shared query's micro-batches at the longest "
                          "(many busy streams)",
    "ingest_retention_seconds": "seconds committed ingest files stay in data_dir/runtime/archive "
                                "(empty: no time bound)",
    "ingest_retention_bytes": "bytes of committed ingest files kept in all (empty: no size "
                              "bound)",
    "stall_seconds": "seconds a stream's input may wait without a completed micro-batch before "
                     "the stream is reported stalled (health, log, a notice to its readers)",
    "join_lateness": "seconds a join waits for its slower side: a record further behind that "
                     "side's latest event time is dropped (the join's state grows with it)",
    "obligation_combining": "how the obligations of several applicable rules combine on a "
                            "stream whose owner chose nothing: intersection (all apply) or "
                            "union (each rule's grant on its own, ASSIST)",
    "audit_max_bytes": "the audit file rotates past this many bytes",
    "audit_keep": "rotated audit files kept",
    "metrics_public": "serve GET /metrics without a token",
    "heartbeat": "seconds between keep-alive lines on idle handle streams",
    "proxy_token": "bearer token caching proxies present on the invalidation feed "
                   "(a secret: prefer the environment or the file to a flag)",
    "proxy_secret": "HMAC key of the webhooks pushed to proxies (a secret: prefer the "
                    "environment or the file to a flag)",
    "proxy_port": "also run the caching proxy on this port, as a child process",
    "cors_origins": "comma-separated origins of web apps allowed to call the API, or *",
    "read_token_key": "HMAC key of handle read tokens (a secret: prefer the environment or the "
                      "file to a flag)",
    "read_token_ttl": "seconds a handle read token stays valid",
    "spark_conf": "a Spark setting, KEY=VALUE, as spark-submit --conf (repeatable; file: "
                  "[spark] table; env: a JSON object)",
    "spark_ui": "run the Spark web UI (port 4040)",
    "spark_log_level": "log level of Spark's JVM side (log4j)",
    "log_level": "log level of the gateway's own lines",
    "log_format": "text or json (one object per line)",
    "delivery": "where handles' rows go: process (this process's buffers) or kafka (a topic per "
                "plan, read by edge processes: xsg edge)",
    "delivery_brokers": "the Kafka brokers of delivery = kafka (host:port,...)",
    "delivery_security_protocol": "how this process connects to them: SASL_PLAINTEXT, SASL_SSL, "
                                  "SSL or PLAINTEXT",
    "delivery_sasl_mechanism": "SASL mechanism: SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN",
    "delivery_username": "this process's own identity on the brokers (a gateway's writes the "
                         "plan topics and manages their ACLs; each edge has its own)",
    "delivery_password": "its password (a secret: prefer the environment or the file to a "
                         "flag)",
    "delivery_topic_prefix": "prefix of the delivery topics' names (plan topics, the control "
                             "and acknowledgement topics)",
    "delivery_retention_seconds": "seconds a plan topic keeps its rows (a reader away longer "
                                  "resumes with a gap)",
    "delivery_retention_bytes": "bytes a plan topic keeps at most",
    "delivery_replication": "replicas of each delivery topic",
    "delivery_ack_timeout": "seconds a revocation waits for every edge's acknowledgement "
                            "before fencing the silent ones off the plan's topic",
    "delivery_realtime": "seconds of a real-time batch for Kafka streams whose plans all "
                         "compile to Spark expressions (Spark's real-time mode); 0: off",
    "delivery_plans_per_topic": "plans of a stream that share one plan topic, each under a "
                                "lane of its own; 1: a topic per plan",
    "oidc.issuer": "accept JWTs of this OIDC issuer (its 'iss'), besides the token file",
    "oidc.audience": "comma-separated audiences; a token's 'aud' must contain one",
    "oidc.jwks_uri": "the issuer's JWKS URL",
    "oidc.algorithms": "comma-separated signature algorithms accepted (asymmetric only)",
    "oidc.leeway": "seconds of clock skew allowed on exp, nbf and iat",
    "oidc.subject_claim": "claim (dotted path) holding the subject",
    "oidc.roles_claims": "comma-separated claim paths holding roles",
    "oidc.admin_role": "callers with this role are administrators",
    "oidc.role_hierarchy_claim": "claim (dotted path) holding a role hierarchy, an object of "
                                 "role -> roles it inherits (with the auth file's)",
    "oidc.attributes": "identity attribute from a claim, ATTRIBUTE_ID=CLAIM_PATH (repeatable; "
                       "file: [oidc.attributes] table; env: a JSON object)",
    "oidc.jwks_cache_seconds": "seconds the issuer's keys are cached",
    "oidc.jwks_refetch_seconds": "at most one JWKS fetch per this many seconds for an unknown kid",
    "oidc.http_timeout": "seconds per JWKS request",
}

DEFAULT_TEXT = {
    "store": "SQLite files under DATA_DIR",
    "delivery_brokers": "none",
    "delivery_username": "none",
    "delivery_password": "none",
    "advertise_url": "from host and port",
    "auth_file": "DATA_DIR/auth.json, created with demo tokens",
    "policies_dir": "./policies",
    "base_url": "from host and port",
    "cors_origins": "none",
    "tls_cert": "plain HTTP",
    "tls_key": "plain HTTP",
    "forwarded_allow_ips": "none",
    "read_token_key": "random per process",
    "proxy_token": "random when a proxy port is set",
    "proxy_secret": "random when a proxy port is set",
    "proxy_port": "no proxy",
    "root_policy_id": "all stored policies",
    "spark_conf": "none",
    "oidc.issuer": "no OIDC",
    "oidc.audience": "required with an issuer",
    "oidc.jwks_uri": "from the issuer's /.well-known/openid-configuration",
    "oidc.admin_role": "none",
    "oidc.role_hierarchy_claim": "none (only the auth file's hierarchy)",
    "oidc.attributes": "none",
}


@dataclass(frozen=True)
class Setting:
    """One setting: `name` is its file key (`oidc.issuer`: key `issuer` of the [oidc] table)."""

    name: str
    kind: str  # str, int, float, bool, path, list, map; "opt" prefixed when it may be unset
    default: Any
    help: str

    @property
    def env(self) -> str:
        return "XSG_" + self.name.upper().replace(".", "_")

    @property
    def flag(self) -> str:
        return FLAG_NAMES.get(self.name) or "--" + self.name.replace(".", "-").replace("_", "-")

    @property
    def default_text(self) -> str:
        if self.name in DEFAULT_TEXT:
            return DEFAULT_TEXT[self.name]
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, (tuple, list)):
            return ",".join(map(str, self.default)) or "none"
        return "none" if self.default is None else str(self.default)


def settings(defaults: Mapping[str, Any] | None = None) -> list[Setting]:
    """Every setting, in GatewayConfig's order, then the `oidc.*` ones."""
    from common.oidc import OidcSettings

    out = []
    for owner, prefix in ((GatewayConfig, ""), (OidcSettings, "oidc.")):
        for f in fields(owner):
            if f.name == "oidc":
                continue
            name = prefix + f.name
            if defaults and name in defaults:
                default = defaults[name]
            elif f.default is not MISSING:
                default = f.default
            elif f.default_factory is not MISSING and name not in DEFAULT_TEXT:
                default = f.default_factory()
            else:
                default = None
            out.append(Setting(name, KINDS.get(str(f.type), "str"), default,
                               SETTING_HELP.get(name, f"GatewayConfig.{f.name}")))
    return out
