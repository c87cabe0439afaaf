"""Ask the gateway for a stream and print its rows as they come, with everything else that
happens to the handle (gaps, notices, lost and regained connections, its end).

    export XSG_URL=http://127.0.0.1:8080 XSG_TOKEN=<your token>
    python read_rows.py weather --query '{"filter": "rainrate > 8"}'

Stops at the handle's end, after --max-rows rows, or once nothing came for --idle seconds.
"""
from __future__ import annotations

import argparse
import json
import os

from xsg_client import Client, Disconnected, End, Gap, Notice, Reconnected, Row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stream")
    parser.add_argument("--action", default="read")
    parser.add_argument("--query", help="your own query, as JSON")
    parser.add_argument("--max-rows", type=int, default=None)
    parser.add_argument("--idle", type=float, default=None,
                        help="stop once nothing came for this many seconds")
    parser.add_argument("--release", action="store_true", help="release the handle at the end")
    args = parser.parse_args(argv)
    query = json.loads(args.query) if args.query else None
    with Client(ca_file=os.environ.get("XSG_CA_FILE")) as xsg:  # XSG_URL, XSG_TOKEN
        grant = xsg.request(args.stream, args.action, query=query)
        print(f"{'new' if grant.new else 'existing'} handle on {grant.stream}")
        for warning in grant.warnings:
            print(f"warning: {warning['message']}")
        rows = 0
        with xsg.open(grant, idle_timeout=args.idle) as stream:
            print("columns:", ", ".join(f"{c.name} {c.type}" for c in stream.schema.columns))
            for event in stream:
                match event:
                    case Row(id=event_id, values=values):
                        print(event_id, values)
                        rows += 1
                        if rows == args.max_rows:
                            break
                    case Gap(lost=lost, reason=reason):
                        print(f"gap: {'some' if lost is None else lost} rows lost ({reason})")
                    case Notice(kind=kind, data=data):
                        print(f"notice {kind}: {data}")
                    case Disconnected(cause=cause, retry_in=retry_in):
                        print(f"connection lost ({cause}); again in {retry_in:.1f} s")
                    case Reconnected(last_event_id=last):
                        print(f"reading again after event {last}")
                    case End(kind=kind, reason=reason):
                        print(f"the handle was {kind}: {reason}")
        print(f"{rows} rows; resume after event {stream.last_event_id}")
        if args.release:
            xsg.release(grant)
            print("released")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
