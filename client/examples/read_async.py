"""Read several handles at once under asyncio: one task per stream, rows printed as they come.

    python read_async.py weather ais --seconds 30
"""
from __future__ import annotations

import argparse
import asyncio
import os

from xsg_client import AsyncClient


async def read(xsg: AsyncClient, stream: str, max_rows: int | None, idle: float | None) -> int:
    grant = await xsg.request(stream)
    handle = await xsg.open(grant, idle_timeout=idle)
    rows = 0
    async for row in handle.rows(on_event=lambda event: print(f"[{stream}] {event}")):
        print(f"[{stream}] {row}")
        rows += 1
        if rows == max_rows:
            break
    return rows


async def main(streams: list[str], max_rows: int | None, idle: float | None) -> None:
    async with AsyncClient(ca_file=os.environ.get("XSG_CA_FILE")) as xsg:  # XSG_URL, XSG_TOKEN
        counts = await asyncio.gather(*(read(xsg, s, max_rows, idle) for s in streams))
        for stream, count in zip(streams, counts, strict=True):
            print(f"{stream}: {count} rows")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("streams", nargs="+")
    parser.add_argument("--max-rows", type=int, default=None)
    parser.add_argument("--idle", type=float, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.streams, args.max_rows, args.idle))
