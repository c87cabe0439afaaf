"""A handle as pandas DataFrames, for an analyst's notebook: a frame every --max-rows rows or
every --max-wait seconds, typed by the handle's schema (timestamps as datetime64[us, UTC], longs
as the exact nullable Int64).

    python frames.py https://gateway:8080/handles/<id> --max-rows 1000 --max-wait 5
"""
from __future__ import annotations

import argparse
import os

from xsg_client import Client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("handle", help="the handle's URL (or id)")
    parser.add_argument("--max-rows", type=int, default=1000)
    parser.add_argument("--max-wait", type=float, default=5.0)
    parser.add_argument("--idle", type=float, default=None)
    parser.add_argument("--frames", type=int, default=None, help="stop after this many frames")
    args = parser.parse_args(argv)
    with Client(ca_file=os.environ.get("XSG_CA_FILE")) as xsg:  # XSG_URL, XSG_TOKEN
        stream = xsg.open(args.handle, idle_timeout=args.idle)
        for i, frame in enumerate(stream.frames(args.max_rows, args.max_wait,
                                                id_column="event_id"), 1):
            print(f"frame {i}: {len(frame)} rows")
            print(frame.dtypes.to_string())
            print(frame.to_string(index=False))
            if i == args.frames:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
