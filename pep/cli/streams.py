"""`xsg stream list | show NAME | delete NAME | derive HANDLE NAME | derivation NAME`: the
streams of a running gateway, over its HTTP API (their owners and administrators delete them;
a consumer whose grant carries the grant option derives a stream from its handle)."""
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


def handle_id_of(text: str) -> str:
    """A handle's id from its URL (`.../handles/<id>`, a read URL's query left aside) or the id
    itself."""
    path = text.split("?", 1)[0].rstrip("/")
    return path.rsplit("/handles/", 1)[1] if "/handles/" in path else path


def cmd_stream_derive(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name}
    if args.description is not None:
        body["description"] = args.description
    if args.listed:
        body["visibility"] = "listed"
    path = "/handles/" + quote(handle_id_of(args.handle), safe="") + "/derive"
    done = call(args, "POST", path, json=body).json()
    if args.json:
        print(json.dumps(done, indent=2))
        return EXIT_OK
    source = done["derived_from"]
    holds = source["holds"]
    print(f"derived {done['name']} from {source['stream']}: owned by {done['owner']}, "
          f"{done['visibility']}")
    print("  attributes: " + ", ".join(f"{f['name']} ({f['type']})" for f in done["schema"]))
    if holds.get("masks"):
        print("  masked by the grant: " + ", ".join(f"{n} as {m}"
                                                    for n, m in holds["masks"].items()))
    if holds.get("window"):
        w = holds["window"]
        print(f"  each row is one {w['type']} window of {w['size']} every {w['step']}")
    print(f"  time attribute: {holds.get('time_attribute') or 'none'}")
    return EXIT_OK


def cmd_stream_derivation(args: argparse.Namespace) -> int:
    print(json.dumps(call(args, "GET", stream_path(args.name) + "/derivation").json(), indent=2))
    return EXIT_OK


def add_stream_commands(sub: Any) -> None:
    """`xsg stream list | show NAME | delete NAME | derive HANDLE NAME | derivation NAME`
    against a running gateway."""
    st = sub.add_parser("stream", help="look at, delete and derive the streams of a running "
                                       "gateway",
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
    dv = ssub.add_parser("derive", help="re-share a handle's rows as a derived stream you own "
                                        "(your grant needs the grant option)")
    dv.add_argument("handle", help="your handle's URL or id")
    dv.add_argument("name", help="the derived stream's name")
    dv.add_argument("--description")
    dv.add_argument("--listed", action="store_true",
                    help="every caller may see it (default: restricted, seen by those your "
                         "policies for it permit)")
    dv.add_argument("--json", action="store_true", help="print the gateway's whole answer")
    dv.set_defaults(func=cmd_stream_derive)
    dn = ssub.add_parser("derivation", help="what a derived stream derives from (its owner and "
                                            "the owners upstream)")
    dn.add_argument("name")
    dn.set_defaults(func=cmd_stream_derivation)
