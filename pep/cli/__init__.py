"""The `xsg` command: run the gateway, manage its policies and streams, decide offline.

This module only builds the parser; each command group is a module of its own: `serve`
(`xsg serve`), `policies` and `rules` (`xsg policy ...`), `streams` (`xsg stream ...`), `pdp`
(`xsg pdp decide`), `consumer` (`xsg request | read | handles | release`, over the xsg client
of `client/`); `common` holds what they share (exit statuses, errors, the HTTP client),
`logs` the process's log lines. Client commands talk to a running gateway over HTTP (--url /
XSG_URL, --token / XSG_TOKEN), so they exercise exactly what any other client gets; `xsg pdp
decide` needs no server at all. `xsg proxy ...` runs the caching proxy (`python -m proxy`).
Exit status: 0 on success, 1 when the gateway refused or failed, 2 on a usage or input error.
"""
from __future__ import annotations

import argparse
import os
import sys

from common.pipes import quiet_on_broken_pipe
from pep.cli.common import EXIT_OK, CliError
from pep.cli.consumer import add_consumer_commands
from pep.cli.edge import add_edge_command
from pep.cli.pdp import add_pdp_commands
from pep.cli.policies import add_policy_commands
from pep.cli.serve import add_serve_command, version
from pep.cli.streams import add_stream_commands

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
  export XSG_TOKEN=<lta's token>
  xsg request policies/weather/lta-request.xml --query '{"filter": "rainrate > 8"}'
  xsg read <handle URL> --follow --format table
  xsg handles
  xsg release <handle URL>
  xsg pdp decide --policies policies/ --request policies/weather/lta-request.xml --explain
  xsg policy test examples/policy-tests/    # policy tests: decisions, and rows on a local Spark
  xsg policy lint policies/                  # what can never apply, conflicting grants, NR
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xsg", description="XACML decision and enforcement gateway for live data streams.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"xsg {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_serve_command(sub)
    add_edge_command(sub)
    add_policy_commands(sub)
    add_stream_commands(sub)
    add_consumer_commands(sub)
    # Listed for --help; main() runs `xsg proxy ...` as the proxy program before parsing.
    sub.add_parser("proxy", help="run the caching proxy in front of a gateway "
                                 "(see: xsg proxy --help)", add_help=False)
    add_pdp_commands(sub)
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

    def run() -> int:
        try:
            return int(args.func(args))
        except CliError as exc:
            print(f"xsg: error: {exc}", file=sys.stderr)
            return exc.status
        except KeyboardInterrupt:
            return 130

    return quiet_on_broken_pipe(run)  # `xsg ... | head`: no traceback, status 141


__all__ = ["EPILOG", "build_parser", "main"]
