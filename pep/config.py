"""Gateway configuration and the embedded defaults that make `xsg serve` work with no flags.

Defaults: everything lives under ./data (created on first start), the policy store is
data/policies.db, it is seeded from policies/ when it is empty, and without --auth a demo auth
file data/auth.json is generated with random tokens for nea (administrator, owner of the weather
stream), lta and other (consumers).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from pdp import AuthFileError, new_token, write_auth_file
from pdp.numbers import INT64_MAX, NumberError, check_float, check_int, parse_float, parse_int
from pdp.oidc import OidcSettings

DEFAULT_PORT = 8080
MAX_SECONDS = 10 ** 9  # about 31 years: every duration setting stays below it
# (low, high) of the number settings no finer rule of GatewayConfig.__post_init__ bounds; the
# others are only checked to be finite numbers of their kind here, and bounded there
NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "proxy_port": (0, 65535), "max_content_length": (1, INT64_MAX),
    "audit_max_bytes": (1, INT64_MAX), "audit_keep": (0, 1_000_000),
    "heartbeat": (0.001, MAX_SECONDS),
    "reevaluation_interval": (0, MAX_SECONDS),  # 0: no periodic re-decision
    "trigger_interval": (0, MAX_SECONDS),  # 0: micro-batches one after the other
}
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
    threads: int = 32  # threads that run routes, started with the server (pep/http/pool.py)
    max_threads: int = 1000  # the pool grows up to this many routes running at once
    # Stream side. `xsg serve` starts Spark with the gateway; tests and embedders leave it lazy
    # (the session then starts with the first handle).
    start_spark: bool = False
    reevaluation_interval: float = 1.0  # seconds between re-decisions of time-dependent grants
    trigger_interval: float = 0.25  # seconds between a stream query's micro-batches
    audit_max_bytes: int = 10 * 1024 * 1024  # the audit file rotates past this size
    audit_keep: int = 10  # rotated audit files kept (the oldest beyond are removed)
    metrics_public: bool = False  # GET /metrics without a token (else an administrator's)
    # Stream runtime (pep/runtime): ingest files a stream's query has committed are kept under
    # data_dir/runtime/archive/<stream>/ this many seconds and this many bytes in all (None: no
    # bound); a stream whose input waits this long without a completed micro-batch is stalled.
    ingest_retention_seconds: float | None = 3600.0
    ingest_retention_bytes: int | None = 1 << 30
    stall_seconds: float = 30.0
    # Joins (pep/runtime/joins.py): a record this many seconds behind the slower side's latest
    # event time is dropped; the join's state holds about its time bound plus this much.
    join_lateness: float = 10.0
    # How the obligations of several applicable rules combine on a stream whose owner chose
    # nothing (`PATCH /streams/<name>` {"combining": ...}): "intersection" (all of them apply)
    # or "union" (ASSIST's union of what each grants: pep/core/union.py).
    obligation_combining: str = "intersection"
    heartbeat: float = 15.0  # seconds between keep-alive lines on idle handle streams
    # Invalidation feed for caching proxies (pep/invalidation/): the bearer token a proxy
    # presents on /events/invalidations and the HMAC key of the webhooks pushed to it.
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
    # Connections and readers (pep/http/serving.py, pep/http/handles.py): open connections at
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

    def __post_init__(self) -> None:
        self._check_numbers()
        self._check_operating_settings()
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
        if isinstance(self.cors_origins, str):
            self.cors_origins = tuple(p.strip() for p in self.cors_origins.split(",") if p.strip())
        self.cors_origins = tuple(self.cors_origins or ())
        if not 1 <= float(self.read_token_ttl) <= 3600:
            raise ValueError(f"read_token_ttl ({self.read_token_ttl}) must be 1 to 3600 seconds")
        for name in ("max_connections", "max_readers_per_subject", "idle_timeout",
                     "write_timeout", "stall_seconds", "header_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if not float(self.min_body_rate) >= 0:
            raise ValueError(f"min_body_rate must be >= 0, got {self.min_body_rate!r}")
        self._check_tls()
        if isinstance(self.forwarded_allow_ips, str):
            self.forwarded_allow_ips = tuple(p.strip() for p in self.forwarded_allow_ips.split(",")
                                             if p.strip())
        self.forwarded_allow_ips = tuple(self.forwarded_allow_ips or ())
        for item in self.forwarded_allow_ips:
            _check_network(item)
        if not 0 <= float(self.join_lateness) <= 86400:
            raise ValueError(f"join_lateness must be 0 to 86400 seconds, got "
                             f"{self.join_lateness!r}")
        if self.obligation_combining not in ("intersection", "union"):
            raise ValueError(f"obligation_combining must be intersection or union, got "
                             f"{self.obligation_combining!r}")
        for name in ("ingest_retention_seconds", "ingest_retention_bytes"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 or unset, got {getattr(self, name)!r}")

    def _check_tls(self) -> None:
        """Both files or neither, and a certificate that loads with its key: a pair that cannot
        be used stops `xsg serve` before anything starts."""
        if self.tls_cert is None and self.tls_key is None:
            return
        if self.tls_cert is None or self.tls_key is None:
            raise ValueError("tls_cert and tls_key go together: set both, or neither")
        self.tls_cert, self.tls_key = Path(self.tls_cert), Path(self.tls_key)
        import ssl

        for name, path in (("tls_cert", self.tls_cert), ("tls_key", self.tls_key)):
            if not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                str(self.tls_cert), str(self.tls_key))
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"tls_cert {self.tls_cert} with tls_key {self.tls_key} cannot be "
                             f"used: {getattr(exc, 'reason', None) or exc}") from None

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"
    def _check_numbers(self) -> None:
        """Every number setting is a number of its kind, finite and in a sane range (a NaN
        passes every `<` check, an infinite timeout never fires), whatever set it: the file,
        the environment, a flag or an embedder. The finer rules follow in __post_init__."""
        for f in fields(self):
            kind = _KINDS.get(str(f.type), "str").removeprefix("opt")
            value = getattr(self, f.name)
            if value is None and str(f.type).endswith("| None"):
                continue
            if kind == "int":
                low, high = NUMBER_RANGES.get(f.name, (-INT64_MAX, INT64_MAX))
                check_int(value, f.name, low=int(low), high=int(high))
            elif kind == "float":
                low, high = NUMBER_RANGES.get(f.name, (-MAX_SECONDS, MAX_SECONDS))
                setattr(self, f.name, check_float(value, f.name, low=low, high=high))

    def _check_operating_settings(self) -> None:
        if isinstance(self.oidc, Mapping):
            self.oidc = OidcSettings(**self.oidc)
        if self.oidc is not None and not isinstance(self.oidc, OidcSettings):
            raise ValueError("oidc must be OidcSettings or a mapping of its fields")
        conf = dict(self.spark_conf or {})
        for key, value in conf.items():
            if not isinstance(key, str) or not key.startswith("spark."):
                raise ValueError(f"spark_conf: {key!r} is not a Spark setting (spark.*)")
            if not isinstance(value, str):
                raise ValueError(f"spark_conf: {key}: the value must be a string")
        self.spark_conf = conf
        self.spark_log_level = str(self.spark_log_level).upper()
        if self.spark_log_level not in SPARK_LOG_LEVELS:
            raise ValueError(f"spark_log_level {self.spark_log_level!r} is not one of "
                             f"{', '.join(SPARK_LOG_LEVELS)}")
        level = str(self.log_level).upper()
        self.log_level = "WARNING" if level == "WARN" else level
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format {self.log_format!r} is not one of "
                             f"{', '.join(LOG_FORMATS)}")

    @property
    def spark_session_conf(self) -> dict[str, str]:
        """What the SparkSession gets beyond the runtime's defaults: the UI setting, then every
        `spark_conf` entry (an explicit spark.ui.enabled there wins over `spark_ui`)."""
        return {"spark.ui.enabled": "true" if self.spark_ui else "false", **self.spark_conf}

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
        return f"{self.scheme}://{host}:{port if port is not None else self.port}"


def _check_network(text: str) -> None:
    """An address or network of a trusted reverse proxy (`*` trusts everyone: refused, since
    any client could then name its own address and scheme)."""
    import ipaddress

    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"forwarded_allow_ips: {text!r} is not an IP address or network"
                         ) from None


# The port of Singapore for the AIS examples (policies/ais/, ASSIST Table 2): the port waters as
# a polygon (lat, lon pairs) and the port's point; the generator's ships sail there.
DEMO_PORT = {"port-bounds": [1.15, 103.60, 1.13, 103.85, 1.18, 104.05, 1.30, 104.05, 1.32, 103.85,
                             1.30, 103.60],
             "port-lat": 1.264, "port-lon": 103.84}

DEMO_USERS: tuple[tuple[str, list[str], bool, dict[str, Any]], ...] = (
    # subject, roles, admin, attributes
    ("nea", ["data-owner"], True, {}),
    ("lta", ["consumer"], False, {}),
    ("other", ["consumer", "port-authority", "medic", "clearance:1"], False,
     {"clearance": 1, **DEMO_PORT}),
    ("shipco", ["ship-company"], False, {"ship-list": [244000001, 244000003, 244000005]}),
    ("captain", ["ship-captain"], False, {"ship-mmsi": 244000007}),
    # multilevel security with categories (policies/mls/position-policy.xml): a label clearance
    ("analyst", ["analyst"], False, {"clearance": "S:{nuclear,crypto}"}),
)


def ensure_data_dir(config: GatewayConfig) -> None:
    config.data_dir.mkdir(parents=True, exist_ok=True)


def ensure_demo_auth_file(config: GatewayConfig) -> bool:
    """Create data_dir/auth.json with fresh random tokens when no --auth was given and it does
    not exist yet; returns True when it was created."""
    if config.auth_file is not None:  # not the demo's
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


# -- operating xsg: every setting from a file, the environment or a flag --------------------------
#
# One precedence, setting by setting: flags > environment (XSG_<SETTING>) > configuration file
# (TOML, `xsg serve --config FILE` or XSG_CONFIG) > defaults (the embedded ones above, with
# SERVE_DEFAULTS for `xsg serve`). The settings are GatewayConfig's fields, so one added there is
# at once a file key, an XSG_ variable and a flag. `spark_conf` merges key by key in the same
# order (file [spark] < XSG_SPARK_CONF < --conf), as spark-submit's --conf does over
# spark-defaults.conf; the [oidc] table's keys are the `oidc.*` settings.

class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting and where it came from."""


SERVE_DEFAULTS: dict[str, Any] = {"start_spark": True}  # `xsg serve` pays Spark's start-up first
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")
LOG_FORMATS = ("text", "json")

FLAG_NAMES = {"auth_file": "--auth", "root_combining_alg": "--root-combining",
              "root_policy_id": "--root-policy", "policies_dir": "--policies",
              "spark_conf": "--conf", "oidc.attributes": "--oidc-attribute"}
SECRET_SETTINGS = frozenset({"proxy_token", "proxy_secret", "read_token_key"})

SETTING_HELP = {
    "host": "interface to listen on",
    "port": "TCP port (0: any free port)",
    "data_dir": "where the policy store, catalogue, handles and audit trail live",
    "auth_file": "token file: JSON list of {token, subject, roles, admin, attributes}; re-read "
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
    "oidc.issuer": "accept JWTs of this OIDC issuer (its 'iss'), besides the token file",
    "oidc.audience": "comma-separated audiences; a token's 'aud' must contain one",
    "oidc.jwks_uri": "the issuer's JWKS URL",
    "oidc.algorithms": "comma-separated signature algorithms accepted (asymmetric only)",
    "oidc.leeway": "seconds of clock skew allowed on exp, nbf and iat",
    "oidc.subject_claim": "claim (dotted path) holding the subject",
    "oidc.roles_claims": "comma-separated claim paths holding roles",
    "oidc.admin_role": "callers with this role are administrators",
    "oidc.attributes": "identity attribute from a claim, ATTRIBUTE_ID=CLAIM_PATH (repeatable; "
                       "file: [oidc.attributes] table; env: a JSON object)",
    "oidc.jwks_cache_seconds": "seconds the issuer's keys are cached",
    "oidc.jwks_refetch_seconds": "at most one JWKS fetch per this many seconds for an unknown kid",
    "oidc.http_timeout": "seconds per JWKS request",
}

DEFAULT_TEXT = {
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
    "oidc.attributes": "none",
}

_KINDS = {"str": "str", "str | None": "optstr", "int": "int", "int | None": "optint",
          "float": "float", "float | None": "optfloat", "bool": "bool", "Path": "path",
          "Path | None": "optpath", "tuple[str, ...]": "list", "dict[str, str]": "map",
          "tuple[tuple[str, str], ...]": "map"}


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
    from pdp.oidc import OidcSettings

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
            out.append(Setting(name, _KINDS.get(str(f.type), "str"), default,
                               SETTING_HELP.get(name, f"GatewayConfig.{f.name}")))
    return out


def _describe(value: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)
    return f"{kind} ({value!r})" if not isinstance(value, (list, dict)) else kind


def _scalar_text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(f"{where}: expected a string, number or boolean, found {_describe(value)}")


def _map_from(value: Any, where: str, flatten: bool = False) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table of KEY = VALUE, found {_describe(value)}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, dict) and flatten:
            out.update({f"{key}.{k}": v for k, v in _map_from(item, f"{where}.{key}", True).items()})
        else:
            out[str(key)] = _scalar_text(item, f"{where}.{key}")
    return out


def _from_text(setting: Setting, text: str, where: str) -> Any:
    """A setting's value from an environment variable or a flag."""
    kind = setting.kind
    if kind.startswith("opt"):
        if not text.strip():
            return None
        kind = kind[3:]
    try:
        if kind == "int":
            return parse_int(text, where, low=-INT64_MAX, high=INT64_MAX)
        if kind == "float":
            return parse_float(text, where, low=-MAX_SECONDS, high=MAX_SECONDS)
    except NumberError:
        what = "an integer" if kind == "int" else "a number"
        raise ConfigError(f"{where}: expected {what}, found {text!r}") from None
    if kind == "bool":
        word = text.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true or false, found {text!r}")
    if kind == "list":
        return tuple(p.strip() for p in text.split(",") if p.strip())
    if kind == "map":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: expected a JSON object, {exc.msg}") from None
        return _map_from(data, where)
    return text


def _from_toml(setting: Setting, value: Any, where: str) -> Any:
    """A setting's value from the configuration file (TOML's own types)."""
    kind = setting.kind.removeprefix("opt")
    if kind in ("str", "path") and isinstance(value, str):
        return value
    try:  # TOML has nan, inf and integers of any size: finite and within 64 bits here
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return check_int(value, where, low=-INT64_MAX, high=INT64_MAX)
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return check_float(value, where, low=-MAX_SECONDS, high=MAX_SECONDS)
    except NumberError as exc:
        raise ConfigError(exc.message) from None
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "list":
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{where}: expected an array of strings, found {_describe(value)}")
    if kind == "map":
        return _map_from(value, where)
    what = {"str": "a string", "path": "a path (string)", "int": "an integer",
            "float": "a number", "bool": "true or false"}[kind]
    raise ConfigError(f"{where}: expected {what}, found {_describe(value)}")


def _spark_conf(values: dict[str, str]) -> dict[str, str]:
    """The [spark] table's keys: `ui.port` and `spark.ui.port` both mean spark.ui.port."""
    return {(k if k.startswith("spark.") else f"spark.{k}"): v for k, v in values.items()}


def read_config_file(path: str | Path, table: dict[str, Setting] | None = None
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """(settings by name, spark conf) from a TOML file; unknown keys and wrong types name the
    key and the file."""
    import difflib
    import tomllib

    path = Path(path)
    table = table if table is not None else {s.name: s for s in settings()}
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror or exc}"
                          ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    spark: dict[str, str] = {}

    def unknown(key: str) -> ConfigError:
        hint = difflib.get_close_matches(key, [*table, "spark", "oidc"], n=1)
        return ConfigError(f"{path}: unknown setting {key!r}"
                           + (f" (did you mean {hint[0]!r}?)" if hint else ""))

    for key, value in data.items():
        if key == "spark":
            spark = _spark_conf(_map_from(value, f"{path}: [spark]", flatten=True))
        elif key == "oidc":
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: oidc must be a table ([oidc])")
            for sub, item in value.items():
                name = f"oidc.{sub}"
                if name not in table:
                    raise unknown(name)
                values[name] = _from_toml(table[name], item, f"{path}: {name}")
        elif key in table and key != "spark_conf" and not key.startswith("oidc."):
            values[key] = _from_toml(table[key], value, f"{path}: {key}")
        else:
            raise unknown(key)
    return values, spark


def load_settings(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                  file: str | Path | None = None, defaults: Mapping[str, Any] | None = None
                  ) -> GatewayConfig:
    """The configuration from flags > environment > file > defaults (module notes above).

    `flags` maps setting names to what the command line gave (text, a bool for on/off flags, a
    list of KEY=VALUE for `spark_conf` and `oidc.attributes`); `env` is usually os.environ."""
    from pdp.oidc import OidcSettings

    table = {s.name: s for s in settings()}
    values: dict[str, Any] = dict(defaults or {})
    spark: dict[str, str] = {}
    if file is not None:
        from_file, spark = read_config_file(file, table)
        values.update(from_file)
    for name, setting in table.items():
        raw = (env or {}).get(setting.env)
        if raw is None:
            continue
        where = f"environment variable {setting.env}"
        if name == "spark_conf":
            spark.update(_from_text(setting, raw, where))
        else:
            values[name] = _from_text(setting, raw, where)
    for name, raw in (flags or {}).items():
        flagged = table.get(name)
        if flagged is None:
            raise ConfigError(f"unknown setting {name!r}")
        setting = flagged
        where = setting.flag
        if setting.kind == "map" and isinstance(raw, (list, tuple)):
            pairs = {}
            for item in raw:
                key, sep, value = str(item).partition("=")
                if not sep or not key.strip():
                    raise ConfigError(f"{where}: expected KEY=VALUE, found {item!r}")
                pairs[key.strip()] = value
            if name == "spark_conf":
                spark.update(pairs)
            else:
                values[name] = pairs
        elif isinstance(raw, str):
            values[name] = _from_text(setting, raw, where)
        else:
            values[name] = raw
    values["spark_conf"] = spark
    oidc = {k[len("oidc."):]: values.pop(k) for k in [k for k in values if k.startswith("oidc.")]}
    if oidc:
        if not oidc.get("issuer"):
            raise ConfigError(f"oidc.{sorted(oidc)[0]} is set but oidc.issuer is not (file "
                              "[oidc] issuer, XSG_OIDC_ISSUER or --oidc-issuer)")
        oidc.setdefault("audience", ())
        try:
            values["oidc"] = OidcSettings(**oidc)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        return GatewayConfig(**values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None
