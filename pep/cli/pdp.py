"""`xsg pdp decide`: a request decided against policy files, with no server (`--explain`: and
why, every policy, rule and Match shown: the files are the caller's own)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pep.cli.common import EXIT_OK, EXIT_USAGE, CliError, read_file


def cmd_pdp_decide(args: argparse.Namespace) -> int:
    from pdp import (
        PolicyEngine,
        PolicyLoadError,
        RequestSyntaxError,
        load_sources,
        parse_request,
        policy_files,
        render_response,
    )

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
        ctx = parse_request(read_file(args.request), media[request_kind])
    except RequestSyntaxError as exc:
        raise CliError(f"invalid request {args.request}: {exc}", EXIT_USAGE) from None
    if args.explain:
        from pdp import explanation_json, explanation_text

        response, explanations = engine.explain(ctx)
    else:
        response, explanations = engine.decide(ctx), []
    out = render_response(response, media[args.format or request_kind])
    sys.stdout.write(out.decode("utf-8"))
    if not out.endswith(b"\n"):
        print()
    for n, explanation in enumerate(explanations, 1):
        heading = "why" if len(explanations) == 1 else f"why (decision {n})"
        print(f"\n{heading}:")
        sys.stdout.write(explanation_text(explanation_json(explanation)))
    return EXIT_OK


def add_pdp_commands(sub: Any) -> None:
    """`xsg pdp decide --policies DIR --request FILE`."""
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
    dec.add_argument("--explain", action="store_true",
                     help="also say why: each policy and rule evaluated, its target's Matches, "
                          "what each combining algorithm did, where each obligation came from")
    dec.set_defaults(func=cmd_pdp_decide)
