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
from urllib.parse import quote

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_URL = "http://127.0.0.1:8080"

EPILOG = """\
examples:
  xsg serve                                  # embedded defaults: ./data, policies/, demo tokens
  xsg serve --port 9000 --auth auth.json --root-combining permit-overrides
  export XSG_TOKEN=<nea's token from the serve banner>
  xsg policy list
  xsg policy add policies/weather/nea-weather-policy.xml
  xsg policy show urn:xsg:example:weather:nea-policy
  xsg policy update urn:xsg:example:weather:nea-policy new-version.xml
  xsg policy delete urn:xsg:example:weather:nea-policy
  xsg pdp decide --policies policies/ --request policies/weather/lta-request.xml
"""


class CliError(Exception):
    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


# -- serve ----------------------------------------------------------------------------------------

def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from pdp import AuthFileError, PolicyLoadError, StoreError
    from pep.config import GatewayConfig
    from pep.serve import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per callback otherwise
    try:
        config = GatewayConfig(
            host=args.host, port=args.port, data_dir=Path(args.data_dir),
            auth_file=Path(args.auth) if args.auth else None,
            root_combining_alg=args.root_combining, root_policy_id=args.root_policy,
            spark_master=args.spark_master, base_url=args.base_url,
            threads=args.threads, max_threads=args.max_threads, start_spark=True,
            proxy_port=args.proxy_port,
            max_connections=args.max_connections,
            max_readers_per_subject=args.max_readers_per_subject,
            idle_timeout=args.idle_timeout, write_timeout=args.write_timeout,
            **({"policies_dir": Path(args.policies)} if args.policies else {}))
        return serve(config)
    except (AuthFileError, PolicyLoadError, StoreError, ValueError) as exc:
        raise CliError(f"cannot start the gateway: {exc}", EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"cannot start the gateway on {args.host}:{args.port}: {exc}") from None


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


def cmd_policy_add(args: argparse.Namespace) -> int:
    r = _call(args, "POST", "/policies", data=_read_file(args.file), headers=XML_HEADERS)
    body = r.json()
    print(f"added {body['id']} version {body['version']} (store version {body['store_version']})")
    return EXIT_OK


def cmd_policy_update(args: argparse.Namespace) -> int:
    r = _call(args, "PUT", _policy_path(args.id), data=_read_file(args.file), headers=XML_HEADERS)
    body = r.json()
    print(f"updated {body['id']} to version {body['version']} "
          f"(store version {body['store_version']})")
    return EXIT_OK


def cmd_policy_list(args: argparse.Namespace) -> int:
    policies = _call(args, "GET", "/policies").json()
    if args.json:
        print(json.dumps(policies, indent=2))
        return EXIT_OK
    if not policies:
        print("no policies")
        return EXIT_OK
    print(f"{'ID':<48} {'VERSION':<9} {'STORE':>5}  {'OWNER':<12} WRITTEN")
    for p in policies:
        print(f"{p['id']:<48} {p['version']:<9} {p['store_version']:>5}  {p['owner']:<12} "
              f"{p['created_at']}")
    return EXIT_OK


def cmd_policy_show(args: argparse.Namespace) -> int:
    params = {}
    if args.version:
        params["version"] = args.version
    if args.store_version is not None:
        params["store_version"] = str(args.store_version)
    if args.history:
        params = {"history": "true"}
    r = _call(args, "GET", _policy_path(args.id), params=params)
    if args.history:
        print(json.dumps(r.json(), indent=2))
    else:
        sys.stdout.write(r.content.decode("utf-8", errors="replace"))
        if not r.content.endswith(b"\n"):
            print()
    return EXIT_OK


def cmd_policy_delete(args: argparse.Namespace) -> int:
    _call(args, "DELETE", _policy_path(args.id))
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


# -- parser ---------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xsg", description="XACML decision and enforcement gateway for live data streams.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("serve", help="run the gateway (HTTP server: pep/http/server.py)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Run the gateway. With no flags: data in ./data, example "
                                   "policies from policies/, demo tokens in data/auth.json.")
    s.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    s.add_argument("--port", type=int, default=8080, help="TCP port (0: any free port)")
    s.add_argument("--data-dir", default="data", help="where the policy store and state live")
    s.add_argument("--auth", metavar="FILE", help="auth file: JSON list of {token, subject, "
                   "roles, admin}; default: data-dir/auth.json with generated demo tokens")
    s.add_argument("--root-combining", metavar="ALG", default="deny-overrides",
                   help="policy-combining algorithm at the root (short name or full URI)")
    s.add_argument("--root-policy", metavar="ID", help="use this stored PolicySet as the root")
    s.add_argument("--policies", metavar="DIR", help="seed an empty store from this directory "
                   "(default: ./policies)")
    s.add_argument("--spark-master", default="local[*]", help="Spark master URL")
    s.add_argument("--base-url", help="public URL of the gateway (for handle URIs)")
    s.add_argument("--threads", type=int, default=32, help="HTTP worker threads at start")
    s.add_argument("--max-threads", type=int, default=1000,
                   help="ceiling for the HTTP worker pool (requests in progress hold a thread; "
                        "idle connections and handle readers do not)")
    s.add_argument("--proxy-port", type=int, metavar="PORT",
                   help="also run the caching proxy on this port, as a child process")
    s.add_argument("--max-connections", type=int, default=4096,
                   help="open connections at once; more are answered 429")
    s.add_argument("--max-readers-per-subject", type=int, default=32,
                   help="handle streams one subject may read at once; more are answered 429")
    s.add_argument("--idle-timeout", type=float, default=20.0, metavar="SECONDS",
                   help="close a connection idle this long before or between requests")
    s.add_argument("--write-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="close a connection whose client has not read for this long (a handle "
                        "reader may resume with Last-Event-ID)")
    s.set_defaults(func=cmd_serve)

    p = sub.add_parser("policy", help="manage the policies of a running gateway",
                       description="Manage the policies of a running gateway (administrators).")
    p.add_argument("--url", default=os.environ.get("XSG_URL", DEFAULT_URL),
                   help="gateway URL (env XSG_URL; default %(default)s)")
    p.add_argument("--token", default=os.environ.get("XSG_TOKEN"),
                   help="bearer token (env XSG_TOKEN)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION")
    psub.required = True
    a = psub.add_parser("add", help="add a policy from a XACML file")
    a.add_argument("file")
    a.set_defaults(func=cmd_policy_add)
    lst = psub.add_parser("list", help="list the current policies")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(func=cmd_policy_list)
    sh = psub.add_parser("show", help="print a policy's XML (current or historical)")
    sh.add_argument("id")
    sh.add_argument("--version", help="the latest stored document with this XACML Version")
    sh.add_argument("--store-version", type=int, help="exactly this store version")
    sh.add_argument("--history", action="store_true", help="list every stored version")
    sh.set_defaults(func=cmd_policy_show)
    d = psub.add_parser("delete", help="delete a policy (its history is kept)")
    d.add_argument("id")
    d.set_defaults(func=cmd_policy_delete)
    u = psub.add_parser("update", help="publish a new version of a policy")
    u.add_argument("id")
    u.add_argument("file")
    u.set_defaults(func=cmd_policy_update)

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
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"xsg: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
