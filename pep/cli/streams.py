"""`xsg stream list | show NAME | delete NAME`: the streams of a running gateway, over its HTTP
API (their owners and administrators delete them)."""
from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from pep.cli.common import EXIT_OK, call, client_options


def stream_path(name: str) -> str:
    return "/streams/" + quote(name, safe="")


def cmd_stream_list(args: argparse.Namespace) -> int:
    streams = call(args, "GET", "/streams").json()["streams"]
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
    print(json.dumps(call(args, "GET", stream_path(args.name)).json(), indent=2))
    return EXIT_OK


def cmd_stream_delete(args: argparse.Namespace) -> int:
    params = {"remove_policies": "true" if args.remove_policies else "false",
              "keep_data": str(args.keep_data)}
    if args.dry_run:
        d = call(args, "GET", stream_path(args.name) + "/dependents", params=params).json()
        print(f"deleting {d['stream']} would revoke {d['live_handles']} live handle(s) "
              f"({d['joins']} join(s)) and remove its events: {', '.join(d['events']) or 'none'}")
        for p in d["policies"]:
            print(f"  policy {p['id']}: {p['action']} ({p['reason']})")
        if d["other_policies"]:
            print(f"  {d['other_policies']} other policy(ies) you do not manage name it: kept")
        return EXIT_OK
    done = call(args, "DELETE", stream_path(args.name), params=params).json()
    data = done["data"]
    print(f"deleted {done['stream']}: {done['handles_revoked']} handle(s) revoked; files "
          + ("removed" if data == "removed" else f"kept until {data['kept_until']}"))
    for p in done["policies"]:
        print(f"  policy {p['id']}: {p['action']} ({p['reason']})")
    return EXIT_OK


def add_stream_commands(sub: Any) -> None:
    """`xsg stream list | show NAME | delete NAME` against a running gateway."""
    st = sub.add_parser("stream", help="look at and delete the streams of a running gateway",
                        description="Streams of a running gateway (their owners and "
                                    "administrators delete them).")
    client_options(st)
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
