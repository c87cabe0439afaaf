"""What a gateway configuration must be: every number finite, of its kind and in range, the
operating settings (Spark, logs, OIDC) well formed, TLS files that load together, trusted proxy
networks that parse. `GatewayConfig.__post_init__` (pep/config/model.py) runs `check_config`, so
no configuration exists that breaks these rules."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from common.numbers import INT64_MAX, check_float, check_int
from common.oidc import OidcSettings

MAX_SECONDS = 10 ** 9  # about 31 years: every duration setting stays below it
# (low, high) of the number settings no finer rule of check_config bounds; the others are only
# checked to be finite numbers of their kind here, and bounded there
NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "proxy_port": (0, 65535), "max_content_length": (1, INT64_MAX),
    "audit_max_bytes": (1, INT64_MAX), "audit_keep": (0, 1_000_000),
    "heartbeat": (0.001, MAX_SECONDS),
    "reevaluation_interval": (0, MAX_SECONDS),  # 0: no periodic re-decision
    "trigger_interval": (0, MAX_SECONDS),  # 0: micro-batches one after the other
    "shared_trigger_min": (0, 3600), "shared_trigger_max": (0.01, 3600),
    "store_pool_size": (1, 1000), "store_timeout": (0.5, 3600),
    "lease_seconds": (1, 600),
    "delivery_retention_seconds": (1, MAX_SECONDS), "delivery_retention_bytes": (1, INT64_MAX),
    "delivery_replication": (1, 32767), "delivery_ack_timeout": (0.05, 60),
    "delivery_realtime": (0, 3600),  # 0: micro-batches only
    "delivery_plans_per_topic": (1, 100_000),
}
DELIVERY_MODES = ("process", "kafka")
REALTIME_MIN_BATCH = 5.0  # seconds: Spark's own minimum real-time batch
DELIVERY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DELIVERY_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")
LOG_FORMATS = ("text", "json")
# a field's type (as its annotation reads) -> the kind of setting it is (pep.config.settings)
KINDS = {"str": "str", "str | None": "optstr", "int": "int", "int | None": "optint",
         "float": "float", "float | None": "optfloat", "bool": "bool", "Path": "path",
         "Path | None": "optpath", "tuple[str, ...]": "list", "dict[str, str]": "map",
         "tuple[tuple[str, str], ...]": "map"}


def check_config(config: Any) -> None:
    """Every rule a `GatewayConfig` (`config`) must meet, whatever set it: the file, the
    environment, a flag or an embedder; paths and lists normalised in place. ValueError names
    the setting."""
    _check_numbers(config)
    _check_operating_settings(config)
    config.data_dir = Path(config.data_dir)
    config.store = check_store(config.store)
    if config.shared_trigger_min > config.shared_trigger_max:
        raise ValueError(f"shared_trigger_min ({config.shared_trigger_min}) is above "
                         f"shared_trigger_max ({config.shared_trigger_max})")
    if 0 < config.delivery_realtime < REALTIME_MIN_BATCH:
        raise ValueError(f"delivery_realtime ({config.delivery_realtime}) must be 0 (off) or at "
                         f"least {REALTIME_MIN_BATCH:g} seconds (Spark's shortest real-time "
                         "batch, spark.sql.streaming.realTimeMode.minBatchDuration)")
    if config.cluster and config.store is None:
        raise ValueError("cluster needs a PostgreSQL store (store = \"postgresql://...\"): "
                         "the processes of one gateway share it")
    if config.cluster and config.proxy_port:
        raise ValueError("proxy_port runs a caching proxy in front of this process alone; in a "
                         "cluster, run one proxy in front of all its processes (python -m proxy "
                         "--upstream URL,URL,...: deploy/local-cluster.sh does)")
    if config.advertise_url is not None:
        config.advertise_url = _check_http_url(config.advertise_url, "advertise_url")
    if config.auth_file is not None:
        config.auth_file = Path(config.auth_file)
    if config.policies_dir is not None:
        config.policies_dir = Path(config.policies_dir)
    if not 0 <= int(config.port) <= 65535:
        raise ValueError(f"port {config.port} is not between 0 and 65535")
    if config.threads < 1 or config.max_threads < config.threads:
        raise ValueError(f"threads ({config.threads}) must be >= 1 and <= max_threads "
                         f"({config.max_threads})")
    if isinstance(config.cors_origins, str):
        config.cors_origins = tuple(p.strip() for p in config.cors_origins.split(",")
                                    if p.strip())
    config.cors_origins = tuple(config.cors_origins or ())
    if not 1 <= float(config.read_token_ttl) <= 3600:
        raise ValueError(f"read_token_ttl ({config.read_token_ttl}) must be 1 to 3600 seconds")
    for name in ("max_connections", "max_readers_per_subject", "idle_timeout",
                 "write_timeout", "stall_seconds", "header_timeout"):
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)!r}")
    if not float(config.min_body_rate) >= 0:
        raise ValueError(f"min_body_rate must be >= 0, got {config.min_body_rate!r}")
    _check_tls(config)
    if isinstance(config.forwarded_allow_ips, str):
        config.forwarded_allow_ips = tuple(p.strip() for p in config.forwarded_allow_ips.split(",")
                                           if p.strip())
    config.forwarded_allow_ips = tuple(config.forwarded_allow_ips or ())
    for item in config.forwarded_allow_ips:
        _check_network(item)
    if not 0 <= float(config.join_lateness) <= 86400:
        raise ValueError(f"join_lateness must be 0 to 86400 seconds, got "
                         f"{config.join_lateness!r}")
    if config.obligation_combining not in ("intersection", "union"):
        raise ValueError(f"obligation_combining must be intersection or union, got "
                         f"{config.obligation_combining!r}")
    _check_delivery(config)
    for name in ("ingest_retention_seconds", "ingest_retention_bytes"):
        if getattr(config, name) is not None and getattr(config, name) < 0:
            raise ValueError(f"{name} must be >= 0 or unset, got {getattr(config, name)!r}")


def _check_delivery(config: Any) -> None:
    """delivery = kafka names its brokers; the other delivery settings are of their kinds."""
    config.delivery = str(config.delivery).strip().lower()
    if config.delivery not in DELIVERY_MODES:
        raise ValueError(f"delivery must be one of {', '.join(DELIVERY_MODES)}, got "
                         f"{config.delivery!r}")
    config.delivery_security_protocol = str(config.delivery_security_protocol).strip().upper()
    if config.delivery_security_protocol not in DELIVERY_PROTOCOLS:
        raise ValueError(f"delivery_security_protocol must be one of "
                         f"{', '.join(DELIVERY_PROTOCOLS)}, got "
                         f"{config.delivery_security_protocol!r}")
    config.delivery_sasl_mechanism = str(config.delivery_sasl_mechanism).strip().upper()
    if config.delivery_sasl_mechanism not in DELIVERY_MECHANISMS:
        raise ValueError(f"delivery_sasl_mechanism must be one of "
                         f"{', '.join(DELIVERY_MECHANISMS)}, got "
                         f"{config.delivery_sasl_mechanism!r}")
    prefix = str(config.delivery_topic_prefix)
    if not prefix or len(prefix) > 100 or any(not (c.isascii() and (c.isalnum() or c in "._-"))
                                               for c in prefix):
        raise ValueError("delivery_topic_prefix must be 1 to 100 of the characters Kafka "
                         f"allows in a topic name (letters, digits, '.', '_', '-'), got "
                         f"{prefix!r}")
    if config.delivery == "kafka":
        if not config.delivery_brokers:
            raise ValueError("delivery = kafka needs delivery_brokers (host:port,...)")
        if config.store is None:
            raise ValueError("delivery = kafka needs a PostgreSQL store (store = "
                             "\"postgresql://...\"): the edges check every handle there")
        if config.delivery_security_protocol.startswith("SASL") and not (
                config.delivery_username and config.delivery_password):
            raise ValueError(f"delivery_security_protocol = "
                             f"{config.delivery_security_protocol} needs delivery_username "
                             "and delivery_password")


def _check_http_url(url: Any, name: str) -> str | None:
    """An http(s)://host[:port] URL (trailing slash dropped), or None for an empty one."""
    from urllib.parse import urlsplit

    if url is None or (isinstance(url, str) and not url.strip()):
        return None
    if not isinstance(url, str):
        raise ValueError(f"{name} must be a URL, not {type(url).__name__}")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name} must be http(s)://HOST[:PORT], got {url!r}")
    return url.strip().rstrip("/")


def check_store(url: Any) -> str | None:
    """The `store` setting: None (or empty) for SQLite, else a PostgreSQL URL that parses;
    ValueError says what is wrong, never echoing a password."""
    if url is None or (isinstance(url, str) and not url.strip()):
        return None
    if not isinstance(url, str):
        raise ValueError(f"store must be a postgresql:// URL, not {type(url).__name__}")
    from common.postgres import check_url

    try:
        check_url(url.strip())
    except ValueError as exc:
        raise ValueError(f"store: {exc}") from None
    return url.strip()


def _check_numbers(config: Any) -> None:
    """Every number setting is a number of its kind, finite and in a sane range (a NaN
    passes every `<` check, an infinite timeout never fires), whatever set it: the file,
    the environment, a flag or an embedder. The finer rules follow in check_config."""
    for f in fields(config):
        kind = KINDS.get(str(f.type), "str").removeprefix("opt")
        value = getattr(config, f.name)
        if value is None and str(f.type).endswith("| None"):
            continue
        if kind == "int":
            low, high = NUMBER_RANGES.get(f.name, (-INT64_MAX, INT64_MAX))
            check_int(value, f.name, low=int(low), high=int(high))
        elif kind == "float":
            low, high = NUMBER_RANGES.get(f.name, (-MAX_SECONDS, MAX_SECONDS))
            setattr(config, f.name, check_float(value, f.name, low=low, high=high))


def _check_operating_settings(config: Any) -> None:
    if isinstance(config.oidc, Mapping):
        config.oidc = OidcSettings(**config.oidc)
    if config.oidc is not None and not isinstance(config.oidc, OidcSettings):
        raise ValueError("oidc must be OidcSettings or a mapping of its fields")
    conf = dict(config.spark_conf or {})
    for key, value in conf.items():
        if not isinstance(key, str) or not key.startswith("spark."):
            raise ValueError(f"spark_conf: {key!r} is not a Spark setting (spark.*)")
        if not isinstance(value, str):
            raise ValueError(f"spark_conf: {key}: the value must be a string")
    config.spark_conf = conf
    config.spark_log_level = str(config.spark_log_level).upper()
    if config.spark_log_level not in SPARK_LOG_LEVELS:
        raise ValueError(f"spark_log_level {config.spark_log_level!r} is not one of "
                         f"{', '.join(SPARK_LOG_LEVELS)}")
    level = str(config.log_level).upper()
    config.log_level = "WARNING" if level == "WARN" else level
    if config.log_level not in LOG_LEVELS:
        raise ValueError(f"log_level {config.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    if config.log_format not in LOG_FORMATS:
        raise ValueError(f"log_format {config.log_format!r} is not one of "
                         f"{', '.join(LOG_FORMATS)}")


def _check_tls(config: Any) -> None:
    """Both files or neither, and a certificate that loads with its key: a pair that cannot
    be used stops `xsg serve` before anything starts."""
    if config.tls_cert is None and config.tls_key is None:
        return
    if config.tls_cert is None or config.tls_key is None:
        raise ValueError("tls_cert and tls_key go together: set both, or neither")
    config.tls_cert, config.tls_key = Path(config.tls_cert), Path(config.tls_key)
    import ssl

    for name, path in (("tls_cert", config.tls_cert), ("tls_key", config.tls_key)):
        if not path.is_file():
            raise ValueError(f"{name}: {path} is not a readable file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            str(config.tls_cert), str(config.tls_key))
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"tls_cert {config.tls_cert} with tls_key {config.tls_key} cannot be "
                         f"used: {getattr(exc, 'reason', None) or exc}") from None


def _check_network(text: str) -> None:
    """An address or network of a trusted reverse proxy (`*` trusts everyone: refused, since
    any client could then name its own address and scheme)."""
    import ipaddress

    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"forwarded_allow_ips: {text!r} is not an IP address or network"
                         ) from None
