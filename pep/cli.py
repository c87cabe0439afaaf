"""The `xsg` command: run the gateway, manage its policies, decide offline.

Client commands talk to a running gateway over HTTP (--url / XSG_URL, --token / XSG_TOKEN), so
they exercise exactly what any other client gets; `xsg pdp decide` needs no server at all.
Exit status: 0 on success, 1 when the gateway refused or failed, 2 on a usage or input error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_URL = "http://127.0.0.1:8080"

EPILOG = """\
examples:
  xsg serve                                  # embedded defaults: ./data, policies/, demo tokens
  xsg serve --port 9000 --auth auth.json --root-combining permit-overrides
  xsg serve --config deploy/xsg.example.toml --log-format json
  export XSG_TOKEN=<nea's token from the serve banner>
  xsg policy list
  xsg policy new --stream weather --subject lta --filter 'rainrate > 5' \
      --attributes samplingtime,rainrate --window tuple:5 --aggregate rainrate:avg --what-if
  xsg policy add policies/weather/nea-weather-policy.xml
  xsg policy add my-rule.yaml                # a sharing rule (.json, .yaml, .yml)
  xsg policy show urn:xsg:example:weather:nea-policy
  xsg policy update urn:xsg:example:weather:nea-policy new-version.xml
  xsg policy delete urn:xsg:example:weather:nea-policy
  xsg stream delete station2 --dry-run
  xsg pdp decide --policies policies/ --request policies/weather/lta-request.xml
"""


def _seconds(text: str) -> float:
    """`--timeout`: pdp.numbers' parser, imported when a flag is read (`xsg --help` stays fast)."""
    from pdp.numbers import float_argument

    return float_argument(0.001, 86400)(text)


def _whole_number(text: str) -> int:
    from pdp.numbers import int_argument

    return int_argument(0)(text)


class CliError(Exception):
    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


# -- serve ----------------------------------------------------------------------------------------

def version() -> str:
    """The installed package's version (its metadata)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("xsg")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _utc_time(record) -> str:
    from datetime import datetime, timezone

    moment = datetime.fromtimestamp(record.created, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def _formatter(fmt: str):
    import logging

    class TextFormatter(logging.Formatter):
        def formatTime(self, record, datefmt=None):  # noqa: N802 - logging's name
            return _utc_time(record)

    class JsonFormatter(logging.Formatter):
        def format(self, record):
            out = {"time": _utc_time(record), "level": record.levelname, "logger": record.name,
                   "message": record.getMessage()}
            access = getattr(record, "access", None)
            if isinstance(access, dict):
                out.update(access)
            if record.exc_info:
                out["exception"] = self.formatException(record.exc_info)
            return json.dumps(out, default=str)

    if fmt == "json":
        return JsonFormatter()
    return TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


# Python-side loggers of py4j and PySpark; PySpark's query-context loggers would otherwise add
# their own handler (and JSON format) when first used, so they are created here, plain.
LIBRARY_LOGGERS = ("py4j", "py4j.java_gateway", "py4j.clientserver", "pyspark",
                   "DataFrameQueryContextLogger", "SQLQueryContextLogger")


def configure_logging(level: str = "INFO", fmt: str = "text", stream=None):
    """One handler on stderr for every line of the process: ours, the access log, py4j's and
    PySpark's Python side; ISO-8601 UTC timestamps. Returns the handler."""
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "xsg", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.xsg = True  # type: ignore[attr-defined]  # marks the handlers this module added
    handler.setFormatter(_formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for own in list(logger.handlers):
            if not isinstance(own, logging.NullHandler):
                logger.removeHandler(own)
        logger.propagate = True
    # py4j logs a line per callback at INFO: only its warnings, unless we debug
    logging.getLogger("py4j").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
    return handler


def serve_flags(args: argparse.Namespace) -> dict:
    """The settings given on the command line (flags default to absent, not to a value)."""
    from pep.config import settings

    names = {s.name for s in settings()}
    return {name: value for name, value in vars(args).items() if name in names}


def cmd_serve(args: argparse.Namespace) -> int:
    from pdp import AuthFileError, PolicyLoadError, StoreError
    from pep.config import SERVE_DEFAULTS, ConfigError, load_settings
    from pep.serve import PortUnavailable, serve

    config_file = args.config or os.environ.get("XSG_CONFIG") or None
    try:
        config = load_settings(serve_flags(args), os.environ, config_file, SERVE_DEFAULTS)
    except ConfigError as exc:
        raise CliError(f"cannot start the gateway: {exc}", EXIT_USAGE) from None
    configure_logging(config.log_level, config.log_format)
    try:
        return serve(config)
    except (AuthFileError, PolicyLoadError, StoreError, ValueError) as exc:
        raise CliError(f"cannot start the gateway: {exc}", EXIT_USAGE) from None
    except PortUnavailable as exc:
        raise CliError(f"cannot start the gateway: {exc}") from None
    except OSError as exc:
        raise CliError(f"cannot start the gateway on {config.host}:{config.port}: {exc}"
                       ) from None


SERVE_DESCRIPTION = """Run the gateway. With no flags: data in ./data, example policies from policies/, demo tokens in
data/auth.json, Spark started before serving.

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
            "max_content_length": "BYTES", "audit_max_bytes": "BYTES", "seed_owner": "SUBJECT"}
KIND_METAVARS = {"int": "N", "optint": "N", "float": "SECONDS", "optfloat": "SECONDS",
                 "list": "A,B,..", "path": "PATH", "optpath": "PATH"}


def _group_of(name: str) -> str:
    if name.startswith("oidc."):
        return "OIDC / JWT bearer tokens (besides the token file)"
    if name.startswith("spark") or name in ("start_spark", "trigger_interval"):
        return "Spark"
    if name.startswith("log_"):
        return "logs (stderr)"
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


# -- policy (HTTP client) -------------------------------------------------------------------------

def _client(args: argparse.Namespace):
    import requests

    if not args.token:
        raise CliError("no token: pass --token or set XSG_TOKEN (see the banner of `xsg serve`)",
                       EXIT_USAGE)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {args.token}"
    return session


def _call(args: argparse.Namespace, method: str, path: str, **kwargs):
    import requests

    url = args.url.rstrip("/") + path
    try:
        response = _client(args).request(method, url, timeout=args.timeout, **kwargs)
    except requests.RequestException as exc:
        raise CliError(f"cannot reach the gateway at {args.url}: {exc}") from None
    if response.status_code >= 400:
        raise CliError(f"{method} {path} failed: HTTP {response.status_code}: {_describe(response)}")
    return response


def _describe(response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason
    if isinstance(body, dict) and "error" in body:
        where = ", ".join(f"{k} {body[k]}" for k in ("source", "element", "line") if body.get(k))
        return body["error"] + (f" ({where})" if where else "")
    return json.dumps(body)


def _read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE) from None


def _policy_path(policy_id: str) -> str:
    return "/policies/" + quote(policy_id, safe="")


XML_HEADERS = {"Content-Type": "application/xacml+xml"}
RULE_JSON = "application/vnd.xsg.rule+json"
RULE_YAML = "application/vnd.xsg.rule+yaml"


def _document_headers(path: str) -> dict:
    """A policy file's media type by its name: a sharing rule (.json, .yaml, .yml) or XACML."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return {"Content-Type": RULE_JSON}
    if suffix in (".yaml", ".yml"):
        return {"Content-Type": RULE_YAML}
    return XML_HEADERS


def _dry_run(args: argparse.Namespace) -> dict:
    return {"dry_run": "true"} if getattr(args, "what_if", False) else {}


def print_what_if(body: dict) -> None:
    """A dry run's answer: what the change would do to the live handles; nothing was done."""
    report = body.get("what_if") or {}
    n = report.get("handles", 0)
    print(f"what-if: {body.get('change')} {body.get('id')}: {n} live handle"
          f"{'' if n == 1 else 's'} would be re-decided: {report.get('revoked', 0)} revoked, "
          f"{report.get('changed', 0)} changed (revoked, the consumer asks again), "
          f"{report.get('kept', 0)} kept")
    for c in report.get("consumers", []):
        streams = ", ".join(c["streams"])
        count = f"{c['handles']} handle{'' if c['handles'] == 1 else 's'}"
        reason = f": {c['reason']}" if c.get("reason") else ""
        print(f"  {c['outcome']:<8} {c['subject']} on {streams} ({count}){reason}")
    for warning in body.get("warnings", []):
        print(f"warning: {warning}")
    print("nothing was changed (dry run)")


def _written(body: dict, verb: str) -> None:
    print(f"{verb} {body['id']} version {body['version']} (store version "
          f"{body['store_version']})")
    if body.get("summary"):
        print(f"  grants: {body['summary']}")
    for warning in body.get("warnings", []):
        print(f"warning: {warning}")


def cmd_policy_add(args: argparse.Namespace) -> int:
    r = _call(args, "POST", "/policies", data=_read_file(args.file),
              headers=_document_headers(args.file), params=_dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        _written(r.json(), "added")
    return EXIT_OK


def cmd_policy_update(args: argparse.Namespace) -> int:
    r = _call(args, "PUT", _policy_path(args.id), data=_read_file(args.file),
              headers=_document_headers(args.file), params=_dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        _written(r.json(), "updated to")
    return EXIT_OK


def _attribute_value(text: str):
    """`--attribute id=value`: a number or true/false when it reads so, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _csv(values: list[str] | None) -> list[str]:
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


def rule_from_flags(args: argparse.Namespace) -> dict:
    """The sharing rule of `xsg policy new`: the file's (if any), then each flag given over it.
    The gateway checks it (errors name the field)."""
    rule: dict = {}
    if args.file:
        import yaml

        text = _read_file(args.file).decode("utf-8", errors="replace")
        try:
            loaded = yaml.safe_load(text) if Path(args.file).suffix.lower() in (
                ".yaml", ".yml") else json.loads(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise CliError(f"cannot read the rule in {args.file}: {exc}", EXIT_USAGE) from None
        if not isinstance(loaded, dict):
            raise CliError(f"{args.file}: a rule is an object (stream, who, ...)", EXIT_USAGE)
        rule = loaded
    for flag, key in (("id", "id"), ("version", "version"), ("stream", "stream"),
                      ("description", "description"), ("filter", "filter")):
        if getattr(args, flag) is not None:
            rule[key] = getattr(args, flag)
    if args.anyone:
        rule["who"] = "anyone"
    elif args.subject or args.role or args.attribute:
        who: dict = {}
        if args.subject:
            who["subjects"] = _csv(args.subject)
        if args.role:
            who["roles"] = _csv(args.role)
        for item in args.attribute or []:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise CliError(f"--attribute {item!r}: write ID=VALUE", EXIT_USAGE)
            who.setdefault("attributes", {}).setdefault(name.strip(), []).append(
                _attribute_value(value))
        rule["who"] = who
    if args.any_action:
        rule["actions"] = "any"
    elif args.action:
        rule["actions"] = _csv(args.action)
    if args.attributes is not None:
        rule["attributes"] = _csv([args.attributes])
    for item in args.mask or []:
        names, sep, spec = item.partition(":")  # lat,lon:grid:0.1: the attributes come first
        if not sep or not names.strip() or not spec.strip():
            raise CliError(f"--mask {item!r}: write ATTR:MASK (speed:round:10, "
                           "lat,lon:grid:0.1, mmsi:hash)", EXIT_USAGE)
        rule.setdefault("mask", {})[names.strip()] = spec.strip()
    if args.window is not None:
        parts = args.window.split(":")
        if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
            raise CliError(f"--window {args.window!r}: write TYPE:SIZE or TYPE:SIZE:STEP "
                           "(tuple:5:2, time:600)", EXIT_USAGE)
        window = dict(rule.get("window") or {})
        window.update(type=parts[0], size=parts[1], step=parts[2] if len(parts) == 3 else
                      parts[1])
        rule["window"] = window
    extras = {"aggregates": _csv(args.aggregate), "group_by": _csv(args.group_by),
              "filterable": _csv(args.filterable)}
    if any(extras.values()) or args.min_count is not None:
        if not rule.get("window"):
            raise CliError("--aggregate, --group-by, --filterable and --min-count need --window",
                           EXIT_USAGE)
        rule["window"].update({k: v for k, v in extras.items() if v})
        if args.min_count is not None:
            rule["window"]["min_count"] = args.min_count
    if args.valid_from is not None or args.valid_until is not None:
        valid = dict(rule.get("valid") or {})
        if args.valid_from is not None:
            valid["from"] = args.valid_from
        if args.valid_until is not None:
            valid["until"] = args.valid_until
        rule["valid"] = valid
    if args.event:
        rule["events"] = _csv(args.event)
    return rule


def _jsonable(value):
    """YAML's dates and times (a rule file's `from: 2026-11-23`) as the text they were."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a rule value")


def cmd_policy_new(args: argparse.Namespace) -> int:
    rule = rule_from_flags(args)
    if args.xacml:
        r = _call(args, "POST", "/rules/preview", data=json.dumps({"rule": rule},
                                                                  default=_jsonable),
                  headers={"Content-Type": "application/json"})
        body = r.json()
        sys.stdout.write(body["xacml"])
        if body.get("summary"):
            print(f"grants: {body['summary']}", file=sys.stderr)
        for warning in body.get("warnings", []):
            print(f"warning: {warning}", file=sys.stderr)
        return EXIT_OK
    data = json.dumps(rule, default=_jsonable).encode()
    headers = {"Content-Type": RULE_JSON}
    if args.replace:
        path = _policy_path(args.replace)
        r = _call(args, "PUT", path, data=data, headers=headers, params=_dry_run(args))
    else:
        r = _call(args, "POST", "/policies", data=data, headers=headers, params=_dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        _written(r.json(), "updated to" if args.replace else "added")
    return EXIT_OK


def cmd_policy_list(args: argparse.Namespace) -> int:
    policies = _call(args, "GET", "/policies").json()
    if args.json:
        print(json.dumps(policies, indent=2))
        return EXIT_OK
    if not policies:
        print("no policies")
        return EXIT_OK
    print(f"{'ID':<48} {'VERSION':<9} {'STORE':>5}  {'OWNER':<12} {'WRITTEN':<29} GRANTS")
    for p in policies:
        print(f"{p['id']:<48} {p['version']:<9} {p['store_version']:>5}  {p['owner']:<12} "
              f"{p['created_at']:<29} {p.get('summary', '')}")
    return EXIT_OK


def _summary_of(args: argparse.Namespace, policy_id: str) -> str | None:
    for p in _call(args, "GET", "/policies").json():
        if p.get("id") == policy_id:
            return p.get("summary")
    return None


def cmd_policy_show(args: argparse.Namespace) -> int:
    params = {}
    if args.version:
        params["version"] = args.version
    if args.store_version is not None:
        params["store_version"] = str(args.store_version)
    if args.history:
        params = {"history": "true"}
    headers = {}
    if args.rule:
        headers["Accept"] = RULE_JSON if args.rule == "json" else RULE_YAML
    r = _call(args, "GET", _policy_path(args.id), params=params, headers=headers)
    if args.history:
        print(json.dumps(r.json(), indent=2))
        return EXIT_OK
    if not (args.raw or args.rule or params):
        summary = _summary_of(args, args.id)
        if summary:
            print(f"# grants: {summary}")
    sys.stdout.write(r.content.decode("utf-8", errors="replace"))
    if not r.content.endswith(b"\n"):
        print()
    return EXIT_OK


def cmd_policy_delete(args: argparse.Namespace) -> int:
    r = _call(args, "DELETE", _policy_path(args.id), params=_dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        print(f"deleted {args.id}")
    return EXIT_OK


# -- pdp decide (offline) -------------------------------------------------------------------------

def cmd_pdp_decide(args: argparse.Namespace) -> int:
    from pdp import (PolicyEngine, PolicyLoadError, RequestSyntaxError, load_sources,
                     parse_request, policy_files, render_response)

    policies = Path(args.policies)
    if not policies.exists():
        raise CliError(f"--policies {policies}: no such file or directory", EXIT_USAGE)
    try:
        paths = [policies] if policies.is_file() else policy_files(policies)
        if not paths:
            raise CliError(f"--policies {policies}: no Policy or PolicySet documents found",
                           EXIT_USAGE)
        engine = PolicyEngine.compile(load_sources(paths), root_combining_alg=args.root_combining,
                                      root_policy_id=args.root_policy)
    except PolicyLoadError as exc:
        raise CliError(f"invalid policy: {exc}", EXIT_USAGE) from None
    request_kind = "json" if args.request.lower().endswith(".json") else "xml"
    media = {"xml": "application/xacml+xml", "json": "application/xacml+json"}
    try:
        ctx = parse_request(_read_file(args.request), media[request_kind])
    except RequestSyntaxError as exc:
        raise CliError(f"invalid request {args.request}: {exc}", EXIT_USAGE) from None
    response = engine.decide(ctx)
    out = render_response(response, media[args.format or request_kind])
    sys.stdout.write(out.decode("utf-8"))
    if not out.endswith(b"\n"):
        print()
    return EXIT_OK


# -- stream (HTTP client) -------------------------------------------------------------------------

def _stream_path(name: str) -> str:
    return "/streams/" + quote(name, safe="")


def cmd_stream_list(args: argparse.Namespace) -> int:
    streams = _call(args, "GET", "/streams").json()["streams"]
    if args.json:
        print(json.dumps(streams, indent=2))
        return EXIT_OK
    if not streams:
        print("no streams")
        return EXIT_OK
    print(f"{'NAME':<24} {'OWNER':<12} {'SOURCE':<10} {'VISIBILITY':<11} ATTRIBUTES")
    for s in streams:
        print(f"{s['name']:<24} {s['owner']:<12} {s['source']['kind']:<10} "
              f"{s.get('visibility', 'listed'):<11} {len(s['schema'])}")
    return EXIT_OK


def cmd_stream_show(args: argparse.Namespace) -> int:
    print(json.dumps(_call(args, "GET", _stream_path(args.name)).json(), indent=2))
    return EXIT_OK


def cmd_stream_delete(args: argparse.Namespace) -> int:
    params = {"remove_policies": "true" if args.remove_policies else "false",
              "keep_data": str(args.keep_data)}
    if args.dry_run:
        d = _call(args, "GET", _stream_path(args.name) + "/dependents", params=params).json()
        print(f"deleting {d['stream']} would revoke {d['live_handles']} live handle(s) "
              f"({d['joins']} join(s)) and remove its events: {', '.join(d['events']) or 'none'}")
        for p in d["policies"]:
            print(f"  policy {p['id']}: {p['action']} ({p['reason']})")
        if d["other_policies"]:
            print(f"  {d['other_policies']} other policy(ies) you do not manage name it: kept")
        return EXIT_OK
    done = _call(args, "DELETE", _stream_path(args.name), params=params).json()
    data = done["data"]
    print(f"deleted {done['stream']}: {done['handles_revoked']} handle(s) revoked; files "
          + ("removed" if data == "removed" else f"kept until {data['kept_until']}"))
    for p in done["policies"]:
        print(f"  policy {p['id']}: {p['action']} ({p['reason']})")
    return EXIT_OK


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("XSG_URL", DEFAULT_URL),
                        help="gateway URL (env XSG_URL; default %(default)s)")
    parser.add_argument("--token", default=os.environ.get("XSG_TOKEN"),
                        help="bearer token (env XSG_TOKEN)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call")


def add_stream_commands(sub) -> None:
    """`xsg stream list | show NAME | delete NAME` against a running gateway."""
    st = sub.add_parser("stream", help="look at and delete the streams of a running gateway",
                        description="Streams of a running gateway (their owners and "
                                    "administrators delete them).")
    _client_options(st)
    ssub = st.add_subparsers(dest="stream_command", metavar="ACTION")
    ssub.required = True
    lst = ssub.add_parser("list", help="the streams you may see")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(func=cmd_stream_list)
    sh = ssub.add_parser("show", help="one stream, as JSON")
    sh.add_argument("name")
    sh.set_defaults(func=cmd_stream_show)
    d = ssub.add_parser("delete", help="delete a stream: its live handles are revoked first")
    d.add_argument("name")
    d.add_argument("--keep-data", type=float, default=0.0, metavar="SECONDS",
                   help="keep its files that long (default: removed at once)")
    d.add_argument("--remove-policies", action="store_true",
                   help="also remove the policies confined to it that you manage")
    d.add_argument("--dry-run", action="store_true", help="only say what it would do")
    d.set_defaults(func=cmd_stream_delete)


# -- parser ---------------------------------------------------------------------------------------

NEW_DESCRIPTION = """Write a sharing rule: what one stream shows to whom. It is compiled to a XACML
3.0 policy by the gateway, stored and enforced like any other (xsg policy show ID prints it).
Flags go over the fields of --file (a rule in JSON or YAML). Lists take repeated flags or
commas: --subject lta,other."""


def add_new_parser(psub, what_if: dict) -> None:
    n = psub.add_parser("new", help="write a sharing rule from flags or a rule file",
                        description=NEW_DESCRIPTION,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    n.add_argument("--file", metavar="RULE", help="a rule file (.json, .yaml, .yml)")
    n.add_argument("--stream", help="the stream shared")
    n.add_argument("--id", help="the policy id (default urn:xsg:rule:<stream>:<who>)")
    n.add_argument("--version", help="the XACML Version (default 1.0)")
    n.add_argument("--description")
    who = n.add_argument_group("who (any one of them)")
    who.add_argument("--subject", action="append", metavar="ID", help="a subject id")
    who.add_argument("--role", action="append", help="a role")
    who.add_argument("--attribute", action="append", metavar="ID=VALUE",
                     help="an attribute the gateway vouches for (auth file or token)")
    who.add_argument("--anyone", action="store_true", help="every authenticated caller")
    what = n.add_argument_group("what")
    what.add_argument("--action", action="append",
                      help="an action id (default: read and subscribe)")
    what.add_argument("--any-action", action="store_true", help="every action")
    what.add_argument("--filter", metavar="CONDITION", help="only tuples meeting it: "
                                                            "'rainrate > 5'")
    what.add_argument("--attributes", metavar="A,B,..", help="the attributes shown "
                                                             "(default: all)")
    what.add_argument("--mask", action="append", metavar="ATTR:MASK",
                      help="shown coarser or hashed: speed:round:10, lat,lon:grid:0.1, "
                           "ts:truncate:minute, speed:bands:0,10,20, name:prefix:3, mmsi:hash, "
                           "name:null")
    window = n.add_argument_group("window (only aggregates are shown)")
    window.add_argument("--window", metavar="TYPE:SIZE[:STEP]",
                        help="tuple:5:2 (tuples) or time:600 (seconds); step defaults to size")
    window.add_argument("--aggregate", action="append", metavar="ATTR:FN",
                        help="rainrate:avg (avg max min sum count firstval lastval)")
    window.add_argument("--min-count", type=int, metavar="N",
                        help="windows of fewer tuples are not shown")
    window.add_argument("--group-by", action="append", metavar="ATTR")
    window.add_argument("--filterable", action="append", metavar="ATTR",
                        help="an attribute the consumer's own filter may use before the window")
    when = n.add_argument_group("when")
    when.add_argument("--valid-from", metavar="DATETIME", help="2026-11-23T00:00:00Z")
    when.add_argument("--valid-until", metavar="DATETIME")
    when.add_argument("--event", action="append", metavar="NAME",
                      help="a stream event that must be open")
    n.add_argument("--replace", metavar="ID", help="publish it as a new version of policy ID")
    n.add_argument("--xacml", action="store_true",
                   help="print the XACML it compiles to, and store nothing")
    n.add_argument("--what-if", **what_if)
    n.set_defaults(func=cmd_policy_new)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xsg", description="XACML decision and enforcement gateway for live data streams.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"xsg {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("serve", help="run the gateway (HTTP server: pep/http/serving.py)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=SERVE_DESCRIPTION)
    s.add_argument("--config", metavar="FILE", default=None,
                   help="TOML configuration file (env XSG_CONFIG)")
    add_serve_settings(s)
    s.set_defaults(func=cmd_serve)

    p = sub.add_parser("policy", help="manage the policies of a running gateway",
                       description="Manage the policies of a running gateway (administrators).")
    p.add_argument("--url", default=os.environ.get("XSG_URL", DEFAULT_URL),
                   help="gateway URL (env XSG_URL; default %(default)s)")
    p.add_argument("--token", default=os.environ.get("XSG_TOKEN"),
                   help="bearer token (env XSG_TOKEN)")
    p.add_argument("--timeout", type=_seconds, default=30.0,
                   help="seconds per HTTP call")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION")
    psub.required = True
    what_if: dict[str, Any] = {"action": "store_true", "dest": "what_if",
               "help": "say what the change would do to the live handles (revoked, changed, "
                       "kept), and change nothing"}
    a = psub.add_parser("add", help="add a policy from a XACML file or a sharing rule "
                                    "(.json, .yaml)")
    a.add_argument("file")
    a.add_argument("--what-if", **what_if)
    a.set_defaults(func=cmd_policy_add)
    add_new_parser(psub, what_if)
    lst = psub.add_parser("list", help="list the current policies")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(func=cmd_policy_list)
    sh = psub.add_parser("show", help="print what a policy grants and its XML (current or "
                                      "historical)")
    sh.add_argument("id")
    sh.add_argument("--raw", action="store_true", help="the XML only, without the summary line")
    sh.add_argument("--rule", nargs="?", const="yaml", choices=("yaml", "json"),
                    help="the sharing rule the policy is (YAML unless json is given)")
    sh.add_argument("--version", help="the latest stored document with this XACML Version")
    sh.add_argument("--store-version", type=_whole_number,
                    help="exactly this store version")
    sh.add_argument("--history", action="store_true", help="list every stored version")
    sh.set_defaults(func=cmd_policy_show)
    d = psub.add_parser("delete", help="delete a policy (its history is kept)")
    d.add_argument("id")
    d.add_argument("--what-if", **what_if)
    d.set_defaults(func=cmd_policy_delete)
    u = psub.add_parser("update", help="publish a new version of a policy (XACML or a rule)")
    u.add_argument("id")
    u.add_argument("file")
    u.add_argument("--what-if", **what_if)
    u.set_defaults(func=cmd_policy_update)

    add_stream_commands(sub)

    # Listed for --help; main() runs `xsg proxy ...` as the proxy program before parsing.
    sub.add_parser("proxy", help="run the caching proxy in front of a gateway "
                                 "(see: xsg proxy --help)", add_help=False)

    x = sub.add_parser("pdp", help="decide without a server")
    xsub = x.add_subparsers(dest="pdp_command", metavar="ACTION")
    xsub.required = True
    dec = xsub.add_parser("decide", help="evaluate a request file against policy files",
                          description="Print the XACML response for a request; no server, no "
                                      "subject binding (the request's own subject is used).")
    dec.add_argument("--policies", required=True, metavar="DIR",
                     help="a policy file, or a directory searched recursively for policies")
    dec.add_argument("--request", required=True, metavar="FILE",
                     help="XACML request (.json: JSON Profile, otherwise XML)")
    dec.add_argument("--format", choices=("xml", "json"),
                     help="response format (default: the request's)")
    dec.add_argument("--root-combining", metavar="ALG", default="deny-overrides")
    dec.add_argument("--root-policy", metavar="ID")
    dec.set_defaults(func=cmd_pdp_decide)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["proxy"]:
        # The proxy is its own program (python -m proxy): run it in this process's place, so
        # that signals and the exit status are its own, without pep importing proxy.
        os.execv(sys.executable, [sys.executable, "-m", "proxy", *argv[1:]])
    parser = build_parser()
    if not argv:  # bare `xsg`: what it can do
        parser.print_help()
        return EXIT_OK
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"xsg: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
