"""The gateway's configuration: `GatewayConfig`, one field per setting, with the embedded
defaults that make `xsg serve` work with no flags (everything under ./data, the policy store
data/policies.db seeded from policies/ when empty). Its rules are `pep.config.validation`'s; a
setting's file key, environment variable and flag are `pep.config.settings`'s."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.oidc import OidcSettings
from pep.config.validation import check_config

DEFAULT_PORT = 8080
DEFAULT_MAX_CONTENT_LENGTH = 10 * 1024 * 1024


def default_policies_dir() -> Path | None:
    """./policies when run from a checkout, else the one beside the installed package."""
    beside = Path(__file__).resolve().parents[2] / "policies"  # pep/config/model.py: 2 up
    for candidate in (Path.cwd() / "policies", beside):
        if candidate.is_dir():
            return candidate
    return None


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    data_dir: Path = Path("data")
    # Where the gateway keeps what it must not forget (common/db.py): None, SQLite files under
    # data_dir (the embedded default); a postgresql:// URL, every store in that database (the
    # audit trail too), through a pool of at most store_pool_size connections per process, each
    # waited for at most store_timeout seconds (then 503; at start, the process stops). Not in
    # the configuration's repr: the URL may hold a password.
    store: str | None = field(default=None, repr=False)
    store_pool_size: int = 10
    store_timeout: float = 5.0
    # Several processes as one gateway (pep/cluster): started on the same PostgreSQL `store` and
    # the same `data_dir` (a folder every process reaches at the same path), each reachable by
    # the others at `advertise_url` (default: the address it listens on); a stream is served by
    # the process holding its lease, which lasts `lease_seconds` without renewal.
    cluster: bool = False
    advertise_url: str | None = None
    lease_seconds: float = 5.0
    auth_file: Path | None = None  # None: use (or create) data_dir/auth.json with demo tokens
    root_combining_alg: str = "deny-overrides"
    root_policy_id: str | None = None
    policies_dir: Path | None = field(default_factory=default_policies_dir)
    seed_owner: str = "xsg-seed"  # recorded as the writer of the seeded example policies
    spark_master: str = "local[*]"
    base_url: str | None = None  # public URL for handles; derived from host/port when unset
    max_content_length: int = DEFAULT_MAX_CONTENT_LENGTH
    threads: int = 32  # threads that run routes, started with the server (server/pool.py)
    max_threads: int = 1000  # the pool grows up to this many routes running at once
    # Stream side. `xsg serve` starts Spark with the gateway; tests and embedders leave it lazy
    # (the session then starts with the first handle).
    start_spark: bool = False
    reevaluation_interval: float = 1.0  # seconds between re-decisions of time-dependent grants
    trigger_interval: float = 0.25  # seconds between a stream query's micro-batches
    # One shared query for this process's ingest streams, one Spark job per micro-batch for all
    # of them (pep/runtime/shared/, docs/operate/many-streams.md), its trigger adapting between
    # these bounds (seconds); other streams keep a query of their own.
    shared_query: bool = False
    shared_trigger_min: float = 0.25
    shared_trigger_max: float = 2.0
    audit_max_bytes: int = 10 * 1024 * 1024  # the audit file rotates past this size
    audit_keep: int = 10  # rotated audit files kept (the oldest beyond are removed)
    metrics_public: bool = False  # GET /metrics without a token (else an administrator's)
    # Stream runtime (pep/runtime): ingest files a stream's query has committed are kept under
    # data_dir/runtime/archive/<stream>/ this many seconds and this many bytes in all (None: no
    # bound); a stream whose input waits this long without a completed micro-batch is stalled.
    ingest_retention_seconds: float | None = 3600.0
    ingest_retention_bytes: int | None = 1 << 30
    stall_seconds: float = 30.0
    # Joins (pep/runtime/joins/runtime.py): a record this many seconds behind the slower side's
    # latest event time is dropped; the join's state holds about its time bound plus this much.
    join_lateness: float = 10.0
    # How the obligations of several applicable rules combine on a stream whose owner chose
    # nothing (`PATCH /streams/<name>` {"combining": ...}): "intersection" (all of them apply)
    # or "union" (ASSIST's union of what each grants: pep/core/union.py).
    obligation_combining: str = "intersection"
    heartbeat: float = 15.0  # seconds between keep-alive lines on idle handle streams
    # Invalidation feed for caching proxies (pep/invalidation/, common/invalidation.py): the
    # bearer token a proxy presents on /events/invalidations and the HMAC key of the webhooks
    # pushed to it.
    proxy_token: str | None = None
    proxy_secret: str | None = None
    proxy_port: int | None = None  # `xsg serve --proxy-port`: also run a proxy beside the gateway
    # Browsers (pep/http/cors.py, pep/http/read_tokens.py). Origins of other web apps allowed to
    # call the API (exact "scheme://host[:port]", or "*"; a string is split at commas); none by
    # default.
    cors_origins: tuple[str, ...] = ()
    # HMAC key of the handle read tokens an EventSource URL carries; None: a random key per
    # process (tokens then die with it).
    read_token_key: str | None = None
    read_token_ttl: float = 300.0  # seconds a handle read token stays valid
    # Operating it (README "Operating xsg"): Spark settings passed to the SparkSession as
    # spark-submit --conf passes them, the web UI, log levels and format, and OIDC issuer whose
    # JWTs are accepted besides the token file. Every field is a setting of `load_settings`.
    spark_conf: dict[str, str] = field(default_factory=dict)
    spark_ui: bool = False
    spark_log_level: str = "WARN"
    log_level: str = "INFO"
    log_format: str = "text"
    oidc: OidcSettings | None = None
    # Connections and readers (server/serving.py, pep/http/handles.py): open connections at
    # once (more are answered 429), handle streams one subject reads at once (more: 429),
    # seconds a connection may sit idle before or between requests, and seconds a write to a
    # client may make no progress before its connection is closed (a reader whose socket does
    # not drain; its handle stays live and it may resume with Last-Event-ID); seconds a request
    # head may take from its first byte, and the bytes/s a request body must average once
    # header_timeout seconds have passed (0: no minimum).
    max_connections: int = 4096
    max_readers_per_subject: int = 32
    idle_timeout: float = 20.0
    write_timeout: float = 30.0
    header_timeout: float = 10.0
    min_body_rate: float = 1024.0
    # TLS (PEM files; both or neither) and the reverse proxies in front whose X-Forwarded-For and
    # X-Forwarded-Proto are trusted (addresses or networks; none by default).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    forwarded_allow_ips: tuple[str, ...] = ()
    # Delivery of handles' rows (pep/delivery): "process", the default, into this process's
    # buffers, read from it; "kafka", each plan's rows written once to a Kafka topic of that plan
    # (by Spark's Kafka sink on the workers; windows by the driver) and read from there by edge
    # processes (`xsg edge`, pep/edge) and by this one. The brokers, this process's own SCRAM
    # identity on them (a gateway's writes and manages the topics and ACLs; each edge has its
    # own, which may only read), the topics' names' prefix, how long and how much a plan topic
    # keeps, its replication, and how long a revocation waits for every edge's acknowledgement
    # before it fences the silent ones off the plan's topic.
    delivery: str = "process"
    delivery_brokers: str | None = None
    delivery_security_protocol: str = "SASL_PLAINTEXT"
    delivery_sasl_mechanism: str = "SCRAM-SHA-512"
    delivery_username: str | None = None
    delivery_password: str | None = field(default=None, repr=False)
    delivery_topic_prefix: str = "xsg."
    delivery_retention_seconds: float = 3600.0
    delivery_retention_bytes: int = 256 * 1024 * 1024
    delivery_replication: int = 1
    delivery_ack_timeout: float = 1.0
    # seconds of a real-time batch (Spark's real-time mode) for a Kafka stream whose plans all
    # compile to Spark expressions (docs/operate/edges.md); 0, the default: micro-batches only
    delivery_realtime: float = 0.0
    # plans of a stream sharing one plan topic, each under a lane (`pep.delivery.lanes`);
    # 1: a topic per plan
    delivery_plans_per_topic: int = 64

    def __post_init__(self) -> None:
        check_config(self)  # pep.config.validation: bounds, kinds, normalised forms

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"

    @property
    def spark_session_conf(self) -> dict[str, str]:
        """What the SparkSession gets beyond the runtime's defaults: the UI setting, then every
        `spark_conf` entry (an explicit spark.ui.enabled there wins over `spark_ui`)."""
        return {"spark.ui.enabled": "true" if self.spark_ui else "false", **self.spark_conf}

    @property
    def store_path(self) -> Path:
        """The SQLite file of the policy store (when `store` is not PostgreSQL)."""
        return self.data_dir / "policies.db"

    @property
    def demo_auth_path(self) -> Path:
        return self.data_dir / "auth.json"

    @property
    def uses_demo_auth(self) -> bool:
        return self.auth_file is None

    @property
    def effective_auth_file(self) -> Path:
        return self.auth_file if self.auth_file is not None else self.demo_auth_path

    def public_base_url(self, port: int | None = None) -> str:
        """The URL clients use; `port` is the bound one when the configured port was 0."""
        if self.base_url:
            return self.base_url.rstrip("/")
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{port if port is not None else self.port}"
