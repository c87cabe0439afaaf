"""A configuration read from flags, the environment, a TOML file and defaults (`load_settings`),
each value checked against its setting's kind where it was given, errors naming the setting and
where it came from (`ConfigError`)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.numbers import INT64_MAX, NumberError, check_float, check_int, parse_float, parse_int
from pep.config.model import GatewayConfig
from pep.config.settings import Setting, settings
from pep.config.validation import MAX_SECONDS, check_store

# -- operating xsg: every setting from a file, the environment or a flag --------------------------
#
# One precedence, setting by setting: flags > environment (XSG_<SETTING>) > configuration file
# (TOML, `xsg serve --config FILE` or XSG_CONFIG) > defaults (GatewayConfig's embedded ones,
# with SERVE_DEFAULTS for `xsg serve`). The settings are GatewayConfig's fields, so one added
# there is at once a file key, an XSG_ variable and a flag. `spark_conf` merges key by key in the
# same order (file [spark] < XSG_SPARK_CONF < --conf), as spark-submit's --conf does over
# spark-defaults.conf; the [oidc] table's keys are the `oidc.*` settings.

class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting and where it came from."""


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
            out.update(
                {f"{key}.{k}": v for k, v in _map_from(item, f"{where}.{key}", True).items()}
            )
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


def _gather(flags: Mapping[str, Any] | None, env: Mapping[str, str] | None,
            file: str | Path | None, defaults: Mapping[str, Any] | None
            ) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """(values, spark conf, where each value came from) from flags > environment > file >
    defaults (the notes above); the values still to be built into a GatewayConfig."""
    table = {s.name: s for s in settings()}
    values: dict[str, Any] = dict(defaults or {})
    origins: dict[str, str] = {name: "default" for name in values}
    spark: dict[str, str] = {}
    if file is not None:
        from_file, spark = read_config_file(file, table)
        values.update(from_file)
        origins.update({name: f"{file}: {name}" for name in from_file})
    for name, setting in table.items():
        raw = (env or {}).get(setting.env)
        if raw is None:
            continue
        where = f"environment variable {setting.env}"
        origins[name] = where
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
        origins[name] = where
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
    return values, spark, origins


def setting_origin(name: str, flags: Mapping[str, Any] | None = None,
                   env: Mapping[str, str] | None = None, file: str | Path | None = None) -> str:
    """Where a setting's value came from, as messages name it: its flag, `environment variable
    XSG_...`, `<file>: <key>`, or `default`."""
    return _gather(flags, env, file, None)[2].get(name, "default")


def load_settings(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                  file: str | Path | None = None, defaults: Mapping[str, Any] | None = None
                  ) -> GatewayConfig:
    """The configuration from flags > environment > file > defaults (the notes above).

    `flags` maps setting names to what the command line gave (text, a bool for on/off flags, a
    list of KEY=VALUE for `spark_conf` and `oidc.attributes`); `env` is usually os.environ."""
    from common.oidc import OidcSettings

    values, spark, origins = _gather(flags, env, file, defaults)
    if values.get("store") is not None:
        try:  # checked here too, to say where the URL came from
            values["store"] = check_store(values["store"])
        except ValueError as exc:
            where = origins.get("store", "store")
            raise ConfigError(f"{where}: {str(exc).removeprefix('store: ')}") from None
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
