"""`xsg serve`: the gateway in the foreground, its settings as flags (one per setting of
`pep.config`, grouped, each with its default and environment variable)."""
from __future__ import annotations

import argparse
import os
from typing import Any

from common.logs import configure_logging, flush_repeats
from pep.cli.common import EXIT_USAGE, CliError


def version() -> str:
    """The installed package's version (its metadata)."""
    from importlib.metadata import PackageNotFoundError, version as package_version

    try:
        return package_version("xsg")
    except PackageNotFoundError:
        return "unknown (not installed)"


def serve_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (flags default to absent, not to a value)."""
    from pep.config import settings

    names = {s.name for s in settings()}
    return {name: value for name, value in vars(args).items() if name in names}


def cmd_serve(args: argparse.Namespace) -> int:
    from common.auth import AuthFileError
    from common.db import StoreError, StoreUnavailable
    from pdp import PolicyLoadError
    from pep.config import SERVE_DEFAULTS, ConfigError, load_settings, setting_origin
    from pep.serve import PortUnavailable, serve

    config_file = args.config or os.environ.get("XSG_CONFIG") or None
    flags = serve_flags(args)
    try:
        config = load_settings(flags, os.environ, config_file, SERVE_DEFAULTS)
    except ConfigError as exc:
        raise CliError(f"cannot start the gateway: {exc}", EXIT_USAGE) from None
    handler = configure_logging(config.log_level, config.log_format)
    try:
        return serve(config)
    except StoreUnavailable as exc:
        # the store the configuration names cannot be used: say which setting, set where
        origin = setting_origin(exc.setting, flags, os.environ, config_file)
        raise CliError(f"cannot start the gateway: {exc.setting} ({origin}): {exc}") from None
    except (AuthFileError, PolicyLoadError, StoreError, ValueError) as exc:
        raise CliError(f"cannot start the gateway: {exc}", EXIT_USAGE) from None
    except PortUnavailable as exc:
        raise CliError(f"cannot start the gateway: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot start the gateway on {config.host}:{config.port}: {exc}"
                       ) from None
    finally:
        flush_repeats(handler)  # the counts of warnings held back, before the process ends


SERVE_DESCRIPTION = """Run the gateway. With no flags: data in ./data, example policies from
policies/, demo tokens in data/auth.json, Spark started before serving.

Every setting below can also be given as an environment variable (shown with it) or as a key
of a TOML configuration file (--config FILE or XSG_CONFIG; the key is the flag's name with _
for -, e.g. data_dir; Spark settings in a [spark] table, the --oidc-* ones in an [oidc] table:
see deploy/xsg.example.toml). Precedence: flags > environment > file > defaults."""


METAVARS = {"auth_file": "FILE", "root_combining_alg": "ALG", "root_policy_id": "ID",
            "policies_dir": "DIR", "data_dir": "DIR", "spark_conf": "KEY=VALUE",
            "oidc.attributes": "ID=CLAIM", "spark_master": "URL", "base_url": "URL",
            "proxy_port": "PORT", "port": "PORT", "host": "HOST", "log_level": "LEVEL",
            "spark_log_level": "LEVEL", "log_format": "text|json", "proxy_token": "TOKEN",
            "proxy_secret": "KEY", "read_token_key": "KEY", "oidc.issuer": "URL",
            "oidc.jwks_uri": "URL", "oidc.subject_claim": "CLAIM", "oidc.admin_role": "ROLE",
            "max_content_length": "BYTES", "audit_max_bytes": "BYTES", "seed_owner": "SUBJECT",
            "min_body_rate": "BYTES/S", "store": "URL", "advertise_url": "URL"}


KIND_METAVARS = {"int": "N", "optint": "N", "float": "SECONDS", "optfloat": "SECONDS",
                 "list": "A,B,..", "path": "PATH", "optpath": "PATH"}


def _group_of(name: str) -> str:
    if name.startswith("oidc."):
        return "OIDC / JWT bearer tokens (besides the token file)"
    if name.startswith("spark") or name in ("start_spark", "trigger_interval"):
        return "Spark"
    if name.startswith("log_"):
        return "logs (stderr)"
    if name.startswith("store"):
        return "store (SQLite files, or PostgreSQL)"
    if name in ("cluster", "advertise_url", "lease_seconds"):
        return "several processes as one gateway (on a PostgreSQL store)"
    if name.startswith(("proxy_", "cors_", "read_token_")):
        return "proxies and browsers"
    return "gateway"


def add_serve_settings(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (pep.config.settings), each showing its default once."""
    from pep.config import SERVE_DEFAULTS, settings

    groups: dict[str, argparse._ArgumentGroup] = {}
    for setting in settings(SERVE_DEFAULTS):
        title = _group_of(setting.name)
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        text = f"{setting.help} (default: {setting.default_text}; env {setting.env})"
        options: dict[str, Any] = {"dest": setting.name, "default": argparse.SUPPRESS,
                   "help": text.replace("%", "%%")}
        if setting.kind == "bool":
            group.add_argument(setting.flag, action=argparse.BooleanOptionalAction, **options)
        elif setting.kind == "map":
            group.add_argument(setting.flag, action="append", metavar=METAVARS[setting.name],
                               **options)
        else:
            metavar = METAVARS.get(setting.name) or KIND_METAVARS.get(setting.kind, "TEXT")
            group.add_argument(setting.flag, metavar=metavar, **options)


def add_serve_command(sub: Any) -> None:
    """`xsg serve [--config FILE] [settings]`."""
    s = sub.add_parser("serve", help="run the gateway (HTTP server: server/serving.py)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=SERVE_DESCRIPTION)
    s.add_argument("--config", metavar="FILE", default=None,
                   help="TOML configuration file (env XSG_CONFIG)")
    add_serve_settings(s)
    s.set_defaults(func=cmd_serve)
