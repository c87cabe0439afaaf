"""`xsg policy add | new | list | show | update | delete`: the policies of a running gateway,
over its HTTP API (administrators). `new` writes a sharing rule (`pep.cli.rules`); `test` and
`lint` need no gateway (`pep.cli.policy_tools`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pep.cli.common import EXIT_OK, URL_HELP, call, read_file, seconds, whole_number
from pep.cli.policy_tools import add_tool_parsers
from pep.cli.rules import add_rule_flags, jsonable, rule_from_flags
from pep.core.jsontypes import JsonObject


def policy_path(policy_id: str) -> str:
    return "/policies/" + quote(policy_id, safe="")


XML_HEADERS = {"Content-Type": "application/xacml+xml"}
RULE_JSON = "application/vnd.xsg.rule+json"
RULE_YAML = "application/vnd.xsg.rule+yaml"


def _document_headers(path: str) -> dict[str, str]:
    """A policy file's media type by its name: a sharing rule (.json, .yaml, .yml) or XACML."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return {"Content-Type": RULE_JSON}
    if suffix in (".yaml", ".yml"):
        return {"Content-Type": RULE_YAML}
    return XML_HEADERS


def dry_run(args: argparse.Namespace) -> dict[str, str]:
    return {"dry_run": "true"} if getattr(args, "what_if", False) else {}


def print_what_if(body: JsonObject) -> None:
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


def _written(body: JsonObject, verb: str) -> None:
    print(f"{verb} {body['id']} version {body['version']} (store version "
          f"{body['store_version']})")
    if body.get("summary"):
        print(f"  grants: {body['summary']}")
    for warning in body.get("warnings", []):
        print(f"warning: {warning}")


def cmd_policy_add(args: argparse.Namespace) -> int:
    r = call(args, "POST", "/policies", data=read_file(args.file),
              headers=_document_headers(args.file), params=dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        _written(r.json(), "added")
    return EXIT_OK


def cmd_policy_update(args: argparse.Namespace) -> int:
    r = call(args, "PUT", policy_path(args.id), data=read_file(args.file),
              headers=_document_headers(args.file), params=dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        _written(r.json(), "updated to")
    return EXIT_OK


def cmd_policy_new(args: argparse.Namespace) -> int:
    rule = rule_from_flags(args)
    if args.xacml:
        r = call(args, "POST", "/rules/preview", data=json.dumps({"rule": rule},
                                                                  default=jsonable),
                  headers={"Content-Type": "application/json"})
        body = r.json()
        sys.stdout.write(body["xacml"])
        if body.get("summary"):
            print(f"grants: {body['summary']}", file=sys.stderr)
        for warning in body.get("warnings", []):
            print(f"warning: {warning}", file=sys.stderr)
        return EXIT_OK
    data = json.dumps(rule, default=jsonable).encode()
    headers = {"Content-Type": RULE_JSON}
    if args.replace:
        path = policy_path(args.replace)
        r = call(args, "PUT", path, data=data, headers=headers, params=dry_run(args))
    else:
        r = call(args, "POST", "/policies", data=data, headers=headers, params=dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        _written(r.json(), "updated to" if args.replace else "added")
    return EXIT_OK


NEW_DESCRIPTION = """Write a sharing rule: what one stream shows to whom. It is compiled to a XACML
3.0 policy by the gateway, stored and enforced like any other (xsg policy show ID prints it).
Flags go over the fields of --file (a rule in JSON or YAML). Lists take repeated flags or
commas: --subject lta,other."""


def add_new_parser(psub: Any, what_if: dict[str, Any]) -> None:
    """`xsg policy new`: a sharing rule from flags (`pep.cli.rules`), added or published."""
    n = psub.add_parser("new", help="write a sharing rule from flags or a rule file",
                        description=NEW_DESCRIPTION,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_rule_flags(n)
    n.add_argument("--replace", metavar="ID", help="publish it as a new version of policy ID")
    n.add_argument("--xacml", action="store_true",
                   help="print the XACML it compiles to, and store nothing")
    n.add_argument("--what-if", **what_if)
    n.set_defaults(func=cmd_policy_new)


def cmd_policy_list(args: argparse.Namespace) -> int:
    policies = call(args, "GET", "/policies").json()
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
    for p in call(args, "GET", "/policies").json():
        if p.get("id") == policy_id:
            summary: str | None = p.get("summary")
            return summary
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
    r = call(args, "GET", policy_path(args.id), params=params, headers=headers)
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
    r = call(args, "DELETE", policy_path(args.id), params=dry_run(args))
    if args.what_if:
        print_what_if(r.json())
    else:
        print(f"deleted {args.id}")
    return EXIT_OK


def add_policy_commands(sub: Any) -> None:
    """`xsg policy ACTION` against a running gateway."""
    p = sub.add_parser("policy", help="manage the policies of a running gateway",
                       description="Manage the policies of a running gateway (administrators).")
    p.add_argument("--url", default=None, help=URL_HELP)
    p.add_argument("--token", default=os.environ.get("XSG_TOKEN"),
                   help="bearer token (env XSG_TOKEN)")
    p.add_argument("--timeout", type=seconds, default=30.0,
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
    sh.add_argument("--store-version", type=whole_number,
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
    add_tool_parsers(psub)
