"""Settings from flags, environment and a TOML file: one precedence, errors that name the key."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from common.oidc import OidcSettings
from pep.config import (
    SERVE_DEFAULTS,
    ConfigError,
    GatewayConfig,
    load_settings,
    read_config_file,
    settings,
)
from pep.config.validation import KINDS as _KINDS

REPO = Path(__file__).resolve().parents[2]


def toml(tmp_path, text: str) -> Path:
    path = tmp_path / "xsg.toml"
    path.write_text(text)
    return path


def test_flags_beat_environment_beat_file_beat_defaults(tmp_path):
    file = toml(tmp_path, 'port = 9001\nhost = "0.0.0.0"\nthreads = 8\nheartbeat = 3\n')
    env = {"XSG_PORT": "9002", "XSG_HOST": "127.0.0.2"}
    config = load_settings({"port": "9003"}, env, file, SERVE_DEFAULTS)
    assert config.port == 9003  # flag
    assert config.host == "127.0.0.2"  # environment over file
    assert config.threads == 8 and config.heartbeat == 3.0  # file over defaults
    assert config.max_threads == 1000 and config.start_spark is True  # defaults (xsg serve's)
    assert load_settings({}, {}, None).start_spark is False  # GatewayConfig's own default


def test_every_setting_can_come_from_each_source(tmp_path):
    """Each GatewayConfig field (and each oidc one) is a known kind, so a file key, an XSG_
    variable and a flag; and each has help."""
    from pep.config import SETTING_HELP

    for owner in (GatewayConfig, OidcSettings):
        for f in fields(owner):
            if f.name != "oidc":
                assert str(f.type) in _KINDS, f"{owner.__name__}.{f.name}: {f.type}"
    names = {s.name for s in settings()}
    assert {f.name for f in fields(GatewayConfig)} - {"oidc"} <= names
    missing = sorted(n for n in names if n not in SETTING_HELP)
    assert missing == [], f"settings without help in pep/config/settings.py SETTING_HELP: {missing}"
    # the same value through each source
    samples = {"int": ("7", 7), "float": ("2.5", 2.5), "bool": ("true", True)}
    for setting in settings():
        kind = setting.kind.removeprefix("opt")
        if kind not in samples or setting.name.startswith("oidc.") or setting.name in (
                "port", "threads", "max_threads", "proxy_port", "read_token_ttl", "cluster",
                "shared_trigger_min",  # 2.5 alone is above the max's default (2.0): refused
                "delivery_realtime"):  # 2.5 is below Spark's 5 s real-time batch: refused
            continue
        text, value = samples[kind]
        by_env = load_settings({}, {setting.env: text}, None)
        by_flag = load_settings({setting.name: text}, {}, None)
        by_file = load_settings({}, {}, toml(tmp_path, f"{setting.name} = {text}\n"))
        assert getattr(by_env, setting.name) == getattr(by_flag, setting.name) == \
            getattr(by_file, setting.name) == value, setting.name


def test_paths_lists_and_optional_values(tmp_path):
    config = load_settings({"auth_file": "a.json"}, {"XSG_CORS_ORIGINS": "https://a, https://b",
                                                     "XSG_BASE_URL": ""},
                           toml(tmp_path, 'data_dir = "/tmp/xsg-data"\nbase_url = "http://x"\n'))
    assert config.auth_file == Path("a.json") and config.data_dir == Path("/tmp/xsg-data")
    assert config.cors_origins == ("https://a", "https://b")
    assert config.base_url is None  # an empty variable unsets an optional setting


@pytest.mark.parametrize("text, message", [
    ("prot = 8080\n", "unknown setting 'prot' (did you mean 'port'?)"),
    ("[oidc]\nissuer = 'https://i'\naudiance = ['x']\n", "unknown setting 'oidc.audiance'"),
    ("[server]\nport = 1\n", "unknown setting 'server'"),
    ("port = '8080'\n", "port: expected an integer, found a string ('8080')"),
    ("threads = 1.5\n", "threads: expected an integer, found a number (1.5)"),
    ("spark_ui = 'yes'\n", "spark_ui: expected true or false, found a string ('yes')"),
    ("data_dir = 3\n", "data_dir: expected a path (string), found an integer (3)"),
    ("cors_origins = [1]\n", "cors_origins: expected an array of strings"),
    ("[spark]\n'spark.jars' = ['a']\n", "[spark].spark.jars: expected a string, number or boolean"),
    ("port = \n", "is not valid TOML"),
    ("store = 'sqlite:///x.db'\n", "store: expected a PostgreSQL URL"),
    ("store = 'postgresql://u:pw@h:99999/x'\n", "store: the port '99999' is not a number"),
])
def test_file_errors_name_the_key_and_the_file(tmp_path, text, message):
    file = toml(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_settings({}, {}, file)
    assert message in str(error.value) and str(file) in str(error.value)


@pytest.mark.parametrize("flags, env, message", [
    ({}, {"XSG_PORT": "http"}, "environment variable XSG_PORT: expected an integer, found 'http'"),
    ({"threads": "many"}, {}, "--threads: expected an integer, found 'many'"),
    ({}, {"XSG_SPARK_UI": "maybe"}, "XSG_SPARK_UI: expected true or false"),
    ({}, {"XSG_SPARK_CONF": "spark.a=b"}, "XSG_SPARK_CONF: expected a JSON object"),
    ({"spark_conf": ["novalue"]}, {}, "--conf: expected KEY=VALUE, found 'novalue'"),
    ({"log_format": "xml"}, {}, "log_format 'xml' is not one of text, json"),
    ({"log_level": "LOUD"}, {}, "log_level 'LOUD' is not one of"),
    ({"spark_log_level": "chatty"}, {}, "spark_log_level 'CHATTY' is not one of"),
    ({"port": "70000"}, {}, "port 70000 is not between 0 and 65535"),
    ({"join_lateness": "-1"}, {}, "join_lateness must be 0 to 86400 seconds"),
    ({"oidc.audience": "x"}, {}, "oidc.audience is set but oidc.issuer is not"),
    ({"oidc.issuer": "https://i"}, {}, "oidc.audience must name at least one audience"),
    ({"oidc.issuer": "https://i", "oidc.audience": "x", "oidc.algorithms": "RS256,HS256"}, {},
     "oidc.algorithms: 'HS256': symmetric"),
])
def test_environment_and_flag_errors_name_the_setting(flags, env, message):
    with pytest.raises(ConfigError) as error:
        load_settings(flags, env, None)
    assert message in str(error.value)


@pytest.mark.parametrize("env, message", [
    # issue 19: int() and float() read any Unicode decimal digit, and float() NaN and infinity
    ({"XSG_PORT": "٣"}, "XSG_PORT: expected an integer, found '٣'"),
    ({"XSG_THREADS": "²"}, "XSG_THREADS: expected an integer, found '²'"),
    ({"XSG_THREADS": "1_000"}, "XSG_THREADS: expected an integer, found '1_000'"),
    ({"XSG_PORT": "9" * 5000}, "XSG_PORT: expected an integer"),
    ({"XSG_HEARTBEAT": "nan"}, "XSG_HEARTBEAT: expected a number, found 'nan'"),
    ({"XSG_IDLE_TIMEOUT": "inf"}, "XSG_IDLE_TIMEOUT: expected a number, found 'inf'"),
    ({"XSG_IDLE_TIMEOUT": "1e999"}, "XSG_IDLE_TIMEOUT: expected a number"),
    ({"XSG_READ_TOKEN_TTL": "٣٠٠"}, "XSG_READ_TOKEN_TTL: expected a number, found '٣٠٠'"),
    ({"XSG_HEARTBEAT": "0"}, "heartbeat must be a number from 0.001"),
    ({"XSG_AUDIT_KEEP": "-1"}, "audit_keep must be a whole number from 0"),
    ({"XSG_PROXY_PORT": "70000"}, "proxy_port must be a whole number from 0 to 65535"),
    ({"XSG_OIDC_ISSUER": "https://i", "XSG_OIDC_AUDIENCE": "x", "XSG_OIDC_HTTP_TIMEOUT": "0"},
     "oidc.http_timeout must be a number from 0.001 to 86400"),
])
def test_numbers_from_the_environment_are_ascii_finite_and_in_range(env, message):
    with pytest.raises(ConfigError) as error:
        load_settings({}, env, None)
    assert message in str(error.value)


@pytest.mark.parametrize("text, message", [
    ("heartbeat = nan\n", "heartbeat must be a number"),
    ("idle_timeout = inf\n", "idle_timeout must be a number"),
    ("write_timeout = -inf\n", "write_timeout must be a number"),
    ("port = 99999999999999999999\n", "port must be a whole number"),
    ("[oidc]\nissuer = 'https://i'\naudience = ['x']\nleeway = nan\n", "oidc.leeway must be"),
])
def test_numbers_from_the_file_are_finite_and_in_range(tmp_path, text, message):
    file = toml(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_settings({}, {}, file)
    assert message in str(error.value) and str(file) in str(error.value)


def test_a_config_built_in_code_is_checked_too():
    from pep.config import GatewayConfig

    for bad in ({"heartbeat": float("nan")}, {"idle_timeout": float("inf")}, {"port": True},
                {"audit_max_bytes": 0}, {"threads": 2.5}):
        with pytest.raises(ValueError):
            GatewayConfig(**bad)


def test_spark_conf_merges_key_by_key_and_the_ui_setting(tmp_path):
    file = toml(tmp_path, '[spark]\n"spark.driver.memory" = "1g"\nsql.shuffle.partitions = 4\n'
                          'spark.ui.port = 4050\n"spark.eventLog.enabled" = true\n')
    config = load_settings(
        {"spark_conf": ["spark.driver.memory=3g", "spark.a.b=x=y"], "spark_ui": True},
        {"XSG_SPARK_CONF": '{"spark.driver.memory": "2g", "spark.ui.port": 4060}'},
        file,
    )
    assert config.spark_conf == {"spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "4",
                                 "spark.ui.port": "4060", "spark.eventLog.enabled": "true",
                                 "spark.a.b": "x=y"}
    assert config.spark_session_conf["spark.ui.enabled"] == "true"
    assert load_settings({}, {}, None).spark_session_conf == {"spark.ui.enabled": "false"}
    explicit = load_settings({"spark_ui": True, "spark_conf": ["spark.ui.enabled=false"]}, {}, None)
    assert explicit.spark_session_conf["spark.ui.enabled"] == "false"
    with pytest.raises(ConfigError, match="spark_conf: 'foo.bar' is not a Spark setting"):
        load_settings({"spark_conf": ["foo.bar=1"]}, {}, None)


def test_spark_log_level_and_log_settings():
    config = load_settings({}, {"XSG_SPARK_LOG_LEVEL": "error", "XSG_LOG_LEVEL": "warn",
                                "XSG_LOG_FORMAT": "json"}, None)
    assert (config.spark_log_level, config.log_level, config.log_format) == \
        ("ERROR", "WARNING", "json")
    assert GatewayConfig().spark_log_level == "WARN"


def test_the_oidc_section_from_each_source(tmp_path):
    file = toml(tmp_path, '[oidc]\nissuer = "https://id.example/realms/r"\naudience = "xsg"\n'
                          'admin_role = "boss"\n[oidc.attributes]\n"urn:x:clearance" = "clr"\n')
    config = load_settings({"oidc.attributes": ["team=groups"]},
                           {"XSG_OIDC_ROLES_CLAIMS": "roles, groups", "XSG_OIDC_LEEWAY": "5"},
                           file)
    oidc = config.oidc
    assert oidc.issuer == "https://id.example/realms/r" and oidc.audience == ("xsg",)
    assert oidc.roles_claims == ("roles", "groups") and oidc.leeway == 5.0
    assert oidc.admin_role == "boss" and oidc.attributes == (("team", "groups"),)  # flag wins
    assert oidc.algorithms == ("RS256", "PS256", "ES256") and oidc.jwks_uri is None
    assert load_settings({}, {}, None).oidc is None


@pytest.mark.parametrize("name", ["xsg.example.toml", "keycloak-oidc.toml"])
def test_the_deploy_examples_parse_and_validate(name):
    path = REPO / "deploy" / name
    values, spark = read_config_file(path)
    config = load_settings({}, {}, path, SERVE_DEFAULTS)
    assert isinstance(config, GatewayConfig) and values
    if name == "keycloak-oidc.toml":
        assert config.oidc.issuer.endswith("/realms/streams")
        assert config.oidc.audience == ("xsg-gateway",) and config.oidc.admin_role == "xsg-admin"
        assert "realm_access.roles" in config.oidc.roles_claims
        assert config.oidc.attributes == (("clearance", "clearance"),)
    else:
        assert spark["spark.driver.memory"] == "2g" and config.spark_conf == spark
        assert config.port == 8080 and config.start_spark is True


def test_server_settings_tls_deadlines_and_forwarded(tmp_path):
    """The server's settings exist as flag, variable and file key alike, and are checked."""
    from tests.server.test_http_server import self_signed

    cert, key = self_signed(tmp_path)
    config = load_settings(flags={"tls_cert": cert, "header_timeout": "5"},
                           env={"XSG_TLS_KEY": key, "XSG_MIN_BODY_RATE": "512",
                                "XSG_FORWARDED_ALLOW_IPS": "10.0.0.5, 192.168.0.0/24"},
                           file=toml(tmp_path, "idle_timeout = 7.5\n"))
    assert str(config.tls_cert) == cert and str(config.tls_key) == key
    assert config.header_timeout == 5 and config.min_body_rate == 512
    assert config.idle_timeout == 7.5
    assert config.forwarded_allow_ips == ("10.0.0.5", "192.168.0.0/24")
    assert config.public_base_url(8443) == "https://127.0.0.1:8443"
    with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
        load_settings(flags={"tls_cert": cert})
    with pytest.raises(ConfigError, match="cannot be used"):
        load_settings(flags={"tls_cert": cert, "tls_key": cert})
    with pytest.raises(ConfigError, match="not an IP address"):
        load_settings(env={"XSG_FORWARDED_ALLOW_IPS": "*"})
    with pytest.raises(ConfigError, match="header_timeout must be positive"):
        load_settings(flags={"header_timeout": "0"})


def test_a_cluster_needs_a_postgresql_store_and_reachable_urls(tmp_path):
    """`cluster` goes with a PostgreSQL store (the processes share it), set from any source;
    `advertise_url` is a URL the other processes can use."""
    store = "postgresql://xsg@db:5432/xsg"
    with pytest.raises(ConfigError, match="cluster needs a PostgreSQL store"):
        load_settings({"cluster": True}, {}, None)
    by_env = load_settings({}, {"XSG_CLUSTER": "true", "XSG_STORE": store,
                                "XSG_LEASE_SECONDS": "3", "XSG_ADVERTISE_URL": "http://h:1/"},
                           None)
    by_file = load_settings({}, {}, toml(tmp_path, f'cluster = true\nstore = "{store}"\n'
                                                   'lease_seconds = 3\n'
                                                   'advertise_url = "http://h:1"\n'))
    for config in (by_env, by_file):
        assert config.cluster and config.lease_seconds == 3.0
        assert config.advertise_url == "http://h:1"
    with pytest.raises(ConfigError, match="in a cluster, run one proxy in front of all"):
        load_settings({"cluster": True, "store": store, "proxy_port": 8081}, {}, None)
    with pytest.raises(ConfigError, match="advertise_url must be http"):
        load_settings({"advertise_url": "h:1"}, {}, None)
    with pytest.raises(ConfigError, match="lease_seconds"):
        load_settings({"lease_seconds": "0.1"}, {}, None)


def test_the_shared_querys_trigger_bounds_are_checked_together():
    config = load_settings({"shared_query": "true", "shared_trigger_min": "0.5",
                            "shared_trigger_max": "3"}, {}, None)
    assert (config.shared_query, config.shared_trigger_min, config.shared_trigger_max) == \
        (True, 0.5, 3.0)
    with pytest.raises(ConfigError, match=r"shared_trigger_min \(2.5\) is above "
                                          r"shared_trigger_max \(2.0\)"):
        load_settings({"shared_trigger_min": "2.5"}, {}, None)
