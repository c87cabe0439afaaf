"""Gateway configuration and the embedded defaults that make `xsg serve` work with no flags.

Defaults: everything lives under ./data (created on first start), the policy store is
data/policies.db, it is seeded from policies/ when it is empty, and without --auth a demo auth
file data/auth.json is generated with random tokens for nea (administrator, owner of the weather
stream), lta and other (consumers).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pdp import AuthFileError, new_token, write_auth_file

DEFAULT_PORT = 8080
DEFAULT_MAX_CONTENT_LENGTH = 10 * 1024 * 1024


def default_policies_dir() -> Path | None:
    """./policies when run from a checkout, else the one beside the installed package."""
    for candidate in (Path.cwd() / "policies", Path(__file__).resolve().parent.parent / "policies"):
        if candidate.is_dir():
            return candidate
    return None


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    data_dir: Path = Path("data")
    auth_file: Path | None = None  # None: use (or create) data_dir/auth.json with demo tokens
    root_combining_alg: str = "deny-overrides"
    root_policy_id: str | None = None
    policies_dir: Path | None = field(default_factory=default_policies_dir)
    seed_owner: str = "xsg-seed"  # recorded as the writer of the seeded example policies
    spark_master: str = "local[*]"
    base_url: str | None = None  # public URL for handles; derived from host/port when unset
    max_content_length: int = DEFAULT_MAX_CONTENT_LENGTH
    threads: int = 32  # worker threads started with the server
    max_threads: int = 1000  # the pool grows up to this while streaming readers hold threads
    # Stream side. `xsg serve` starts Spark with the gateway; tests and embedders leave it lazy
    # (the session then starts with the first handle).
    start_spark: bool = False
    reevaluation_interval: float = 1.0  # seconds between re-decisions of time-dependent grants
    trigger_interval: float = 0.25  # seconds between a stream query's micro-batches
    # Stream runtime (pep/runtime): ingest files a stream's query has committed are kept under
    # data_dir/runtime/archive/<stream>/ this many seconds and this many bytes in all (None: no
    # bound); a stream whose input waits this long without a completed micro-batch is stalled.
    ingest_retention_seconds: float | None = 3600.0
    ingest_retention_bytes: int | None = 1 << 30
    stall_seconds: float = 30.0
    heartbeat: float = 15.0  # seconds between keep-alive lines on idle handle streams
    # Invalidation feed for caching proxies (pep/invalidation/): the bearer token a proxy
    # presents on /events/invalidations and the HMAC key of the webhooks pushed to it.
    proxy_token: str | None = None
    proxy_secret: str | None = None
    proxy_port: int | None = None  # `xsg serve --proxy-port`: also run a proxy beside the gateway

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.auth_file is not None:
            self.auth_file = Path(self.auth_file)
        if self.policies_dir is not None:
            self.policies_dir = Path(self.policies_dir)
        if not 0 <= int(self.port) <= 65535:
            raise ValueError(f"port {self.port} is not between 0 and 65535")
        if self.threads < 1 or self.max_threads < self.threads:
            raise ValueError(f"threads ({self.threads}) must be >= 1 and <= max_threads "
                             f"({self.max_threads})")

    @property
    def store_path(self) -> Path:
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
        return f"http://{host}:{port if port is not None else self.port}"


DEMO_USERS = (
    # subject, roles, admin, attributes
    ("nea", ["data-owner"], True, {}),
    ("lta", ["consumer"], False, {}),
    ("other", ["consumer", "port-authority", "medic", "clearance:1"], False, {"clearance": 1}),
)


def ensure_data_dir(config: GatewayConfig) -> None:
    config.data_dir.mkdir(parents=True, exist_ok=True)


def ensure_demo_auth_file(config: GatewayConfig) -> bool:
    """Create data_dir/auth.json with fresh random tokens when no --auth was given and it does
    not exist yet; returns True when it was created."""
    if not config.uses_demo_auth:
        if not config.auth_file.is_file():
            raise AuthFileError(f"auth file {config.auth_file} does not exist")
        return False
    path = config.demo_auth_path
    if path.exists():
        return False
    write_auth_file(path, [{"token": new_token(), "subject": subject, "roles": roles,
                            "admin": admin, **({"attributes": attrs} if attrs else {})}
                           for subject, roles, admin, attrs in DEMO_USERS])
    return True
