"""`xsg request | read | handles | release`: a consumer's commands, over the xsg client
(`client/`, the `xsg_client` package), so they do exactly what any consumer's code does.

- `xsg request FILE [--query Q]`: send a XACML request file (XML or JSON) with an optional
  query (a file, or the query's XML or JSON text); prints the handle, the warnings, the plan.
- `xsg read HANDLE [--format ndjson|csv|table] [--follow]`: the handle's rows on stdout; on
  stderr the progress (rows, rate, the last notice) and every gap, notice, lost and regained
  connection. Without --follow it stops once nothing came for --idle seconds; with it, it reads
  until the handle ends, resuming after a dropped connection or a gateway restart.
- `xsg handles`: the caller's handles; `xsg release HANDLE`: let one go.

HANDLE is the handle's URL (as `xsg request` printed it; a read URL with `?read_token=` needs
no bearer token) or its id. Exit status: 0 done (`xsg read`: the handle ended, was released, or
went idle), 1 the gateway refused or failed (`xsg read`: the handle was revoked, or the gateway
stayed unreachable), 2 a usage or input error (a malformed handle, an unreadable file).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pep.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, client_options, gateway_url

if TYPE_CHECKING:
    from xsg_client import Client, Event, HandleSchema

FORMATS = ("ndjson", "csv", "table")
DEFAULT_IDLE = 2.0  # seconds without an event after which `xsg read` (no --follow) stops
TABLE_WIDTHS = {"timestamp": 27, "long": 20, "double": 14, "boolean": 5, "string": 20,
                "json": 20}


def _need_client(args: argparse.Namespace, token: bool = True) -> None:
    """The client is installed (it is its own package: `client/`), and a token given when the
    command needs one."""
    try:
        import xsg_client  # noqa: F401 - imported to see that it is installed
    except ImportError:
        raise CliError("the consumer commands need the xsg client: pip install ./client",
                       EXIT_USAGE) from None
    if token and not args.token:
        raise CliError("no token: pass --token or set XSG_TOKEN (see the banner of `xsg serve`)",
                       EXIT_USAGE)


def _client(args: argparse.Namespace) -> Client:
    from xsg_client import Client, XsgError

    base, source = gateway_url(args)
    if not base.startswith(("http://", "https://")):
        raise CliError(f"the gateway URL {base!r} ({source}) is not an http:// or https:// "
                       "URL", EXIT_USAGE)
    try:
        return Client(base, args.token, ca_file=args.ca_file, timeout=args.timeout)
    except XsgError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def _run(args: argparse.Namespace, command: Callable[[Client], int]) -> int:
    """`command` with a client; the client's errors as the CLI's (BadHandle: a usage error;
    no answer at all: which gateway was tried, and how to name another, as every command)."""
    from xsg_client import BadHandle, Unreachable, XsgError

    with _client(args) as client:
        try:
            return command(client)
        except BadHandle as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        except Unreachable as exc:
            _, source = gateway_url(args)
            raise CliError(
                f"cannot reach the gateway at {exc.url} ({source}): {exc.cause}.\n"
                "  Start one with `xsg serve` (or `make run`), or name yours: --url URL, or\n"
                "  export XSG_URL=URL XSG_TOKEN=TOKEN (the banner of `xsg serve` prints the "
                "lines to paste).") from None
        except XsgError as exc:
            raise CliError(str(exc), EXIT_FAILED) from None


# -- xsg request -----------------------------------------------------------------------------------

def _query(text: str | None) -> str | bytes | None:
    """--query: a file's contents, or the query's own XML or JSON text."""
    if text is None:
        return None
    stripped = text.lstrip()
    if stripped.startswith(("{", "<")):
        return text
    try:
        return Path(text).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read the query {text}: {exc.strerror or exc} (give a file, or "
                       "the query's JSON or XML text)", EXIT_USAGE) from None


def cmd_request(args: argparse.Namespace) -> int:
    _need_client(args)
    from xsg_client import AccessRequest, XsgError

    try:
        access = AccessRequest.from_file(args.file, _query(args.query))
    except XsgError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None

    def run(client: Client) -> int:
        grant = client.send(access)
        if args.json:
            print(json.dumps(grant.raw, indent=2))
            return EXIT_OK
        print(grant.handle)
        kind = "new handle" if grant.new else "your live handle for the same plan"
        print(f"  {kind} on {', '.join(grant.streams)}; policies: "
              f"{', '.join(grant.policy_ids) or 'none'}")
        for warning in grant.warnings:
            print(f"  warning ({warning.get('kind', '?')}): {warning.get('message', '')}")
        if grant.privacy:
            print(f"  privacy: {json.dumps(grant.privacy)}")
        if grant.sql:
            print("  plan:")
            for line in grant.sql.splitlines():
                print(f"    {line}")
        return EXIT_OK

    return _run(args, run)


# -- xsg read --------------------------------------------------------------------------------------

class Progress:
    """The reader's progress on stderr: on a terminal one line kept up to date (rows, rate, the
    last notice); every gap, notice and connection event also as a line of its own."""

    def __init__(self, out: TextIO, live: bool) -> None:
        self.out = out
        self.live = live
        self.rows = 0
        self.started = time.monotonic()
        self.last_notice = ""
        self._shown_at = 0.0
        self._line = False

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.rows / elapsed if elapsed > 0 else 0.0

    def status(self) -> str:
        text = f"{self.rows} rows, {self.rate():.0f} rows/s"
        return text + (f"; last: {self.last_notice}" if self.last_notice else "")

    def row(self) -> None:
        self.rows += 1
        if self.live and time.monotonic() - self._shown_at >= 0.25:
            self._show()

    def _show(self) -> None:
        self._shown_at = time.monotonic()
        self.out.write("\r\x1b[K" + self.status())
        self.out.flush()
        self._line = True

    def say(self, text: str) -> None:
        self.last_notice = text
        if self._line:
            self.out.write("\r\x1b[K")
            self._line = False
        self.out.write(f"xsg read: {text}\n")
        self.out.flush()
        if self.live:
            self._show()

    def done(self, how: str) -> None:
        if self._line:
            self.out.write("\r\x1b[K")
            self._line = False
        elapsed = time.monotonic() - self.started
        self.out.write(f"xsg read: {self.rows} rows in {elapsed:.1f} s "
                       f"({self.rate():.0f} rows/s); {how}\n")
        self.out.flush()


def describe_event(event: Event) -> str:
    """A non-row event as a line of the progress."""
    from xsg_client import Disconnected, End, Gap, Notice, Reconnected

    if isinstance(event, Gap):
        lost = "an unknown number of rows" if event.lost is None else f"{event.lost} rows"
        return f"gap at event {event.id}: {lost} lost ({event.reason or 'no reason given'})"
    if isinstance(event, Notice):
        details = ", ".join(f"{k} {v}" for k, v in event.data.items())
        return f"{event.kind} (event {event.id})" + (f": {details}" if details else "")
    if isinstance(event, Disconnected):
        return (f"connection lost ({event.cause}); attempt {event.attempt} in "
                f"{event.retry_in:.1f} s")
    if isinstance(event, Reconnected):
        return (f"reading again after event {event.last_event_id} "
                f"({event.outage:.1f} s without a connection)")
    if isinstance(event, End):
        return str(event)
    return repr(event)


class RowWriter:
    """Rows on stdout as NDJSON (the gateway's own lines: `{"id": n, "row": {...}}`), CSV (a
    header, then the values; timestamps as the gateway writes them) or a table."""

    def __init__(self, fmt: str, schema: HandleSchema, out: TextIO) -> None:
        self.fmt = fmt
        self.out = out
        self.names = list(schema.names)
        self.widths = [max(len(c.name), TABLE_WIDTHS[c.type]) for c in schema.columns]
        self._csv = csv.writer(out, lineterminator="\n")
        self._started = False

    def _header(self, row: dict[str, Any]) -> None:
        self._started = True
        self.names += [k for k in row if k not in self.names]
        self.widths += [max(len(k), 20) for k in self.names[len(self.widths):]]
        if self.fmt == "csv":
            self._csv.writerow(self.names)
        elif self.fmt == "table":
            self.out.write(
                "  ".join(n.ljust(w) for n, w in zip(self.names, self.widths, strict=True)).rstrip()
                + "\n"
            )

    def write(self, event_id: int, row: dict[str, Any]) -> None:
        from xsg_client.schema import wire_value

        if self.fmt == "ndjson":
            wire = {k: wire_value(v) for k, v in row.items()}
            self.out.write(json.dumps({"id": event_id, "row": wire}, separators=(",", ":"))
                           + "\n")
        else:
            if not self._started:
                self._header(row)
            values = [wire_value(row.get(n)) for n in self.names]
            if self.fmt == "csv":
                self._csv.writerow(["" if v is None else v for v in values])
            else:
                cells = []
                for value, width in zip(values, self.widths, strict=True):
                    text = "" if value is None else str(value)
                    cells.append(text if len(text) <= width else text[:width - 1] + "~")
                self.out.write(
                    "  ".join(c.ljust(w) for c, w in zip(cells, self.widths, strict=True)).rstrip()
                    + "\n"
                )
        self.out.flush()


def cmd_read(args: argparse.Namespace) -> int:
    _need_client(args, token=False)
    from xsg_client import BadHandle, End, Row, handle_ref

    try:  # a read URL (?read_token=) needs no bearer token
        with_token = handle_ref(args.handle, gateway_url(args)[0]).read_token is not None
    except BadHandle as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if not with_token:
        _need_client(args)

    def run(client: Client) -> int:
        stream = client.open(args.handle, last_event_id=args.from_id,
                             idle_timeout=None if args.follow else args.idle,
                             resume_after_shutdown=args.follow)
        writer = RowWriter(args.format, stream.schema, sys.stdout)
        progress = Progress(sys.stderr, sys.stderr.isatty())
        try:
            for event in stream:
                if isinstance(event, Row):
                    writer.write(event.id, event.values)
                    progress.row()
                else:
                    progress.say(describe_event(event))
        except KeyboardInterrupt:
            progress.done(f"interrupted; resume with --from {stream.last_event_id}")
            return 130
        end = stream.end
        if isinstance(end, End):
            progress.done(str(end))
            return EXIT_FAILED if end.kind == "revoked" else EXIT_OK
        progress.done(f"nothing more for {args.idle:g} s; resume with --from "
                      f"{stream.last_event_id}" if stream.last_event_id is not None
                      else f"nothing came for {args.idle:g} s")
        return EXIT_OK

    return _run(args, run)


# -- xsg handles, xsg release ----------------------------------------------------------------------

def cmd_handles(args: argparse.Namespace) -> int:
    _need_client(args)

    def run(client: Client) -> int:
        handles = client.handles()
        if args.json:
            print(json.dumps([dataclasses.asdict(h) for h in handles], indent=2))
            return EXIT_OK
        if not handles:
            print("no handles")
            return EXIT_OK
        print(f"{'HANDLE':<{len(handles[0].handle)}}  {'STATE':<8}  {'STREAM':<16}  "
              f"{'CREATED':<29}  REASON")
        for h in handles:
            print(f"{h.handle}  {h.state:<8}  {', '.join(h.streams):<16}  "
                  f"{h.created_at or '':<29}  {h.reason or ''}".rstrip())
        return EXIT_OK

    return _run(args, run)


def cmd_release(args: argparse.Namespace) -> int:
    _need_client(args)

    def run(client: Client) -> int:
        ref = client.ref(args.handle)
        done = client.release(ref)
        state = done.get("state") if isinstance(done, dict) else None
        print(f"released {ref.shown} (state {state})")
        return EXIT_OK

    return _run(args, run)


# -- the parser ------------------------------------------------------------------------------------

def _consumer_options(parser: argparse.ArgumentParser) -> None:
    client_options(parser)
    parser.add_argument("--ca-file", default=os.environ.get("XSG_CA_FILE"),
                        help="PEM file of the authorities that sign the gateway's certificate "
                             "(env XSG_CA_FILE; default: the system's)")


def _event_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an event id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an event id is not negative: {value}")
    return value


def _idle(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"--idle is between 0.1 and 3600 s, not {value:g}")
    return value


def add_consumer_commands(sub: Any) -> None:
    """`xsg request`, `xsg read`, `xsg handles`, `xsg release`: a consumer's commands."""
    rq = sub.add_parser("request", help="ask for a stream with a XACML request file: prints "
                                        "the handle, warnings and plan")
    _consumer_options(rq)
    rq.add_argument("file", help="the XACML request (XML or JSON), sent as it is")
    rq.add_argument("--query", metavar="Q",
                    help="your own query: a file, or its JSON or XML text")
    rq.add_argument("--json", action="store_true", help="print the gateway's whole answer")
    rq.set_defaults(func=cmd_request)

    rd = sub.add_parser("read", help="read a handle's rows (progress on stderr)")
    _consumer_options(rd)
    rd.add_argument("handle", help="the handle's URL (or a read URL), or its id")
    rd.add_argument("--format", choices=FORMATS, default="ndjson",
                    help="rows as NDJSON (the gateway's lines), CSV or a table "
                         "(default %(default)s)")
    rd.add_argument("--follow", "-f", action="store_true",
                    help="read until the handle ends, resuming across lost connections and "
                         "gateway restarts")
    rd.add_argument("--from", dest="from_id", type=_event_id, metavar="ID",
                    help="start after this event id (what a reader stopped at)")
    rd.add_argument("--idle", type=_idle, default=DEFAULT_IDLE, metavar="SECONDS",
                    help="without --follow: stop once nothing came for this long "
                         "(default %(default)s)")
    rd.set_defaults(func=cmd_read)

    hs = sub.add_parser("handles", help="your handles and their state")
    _consumer_options(hs)
    hs.add_argument("--json", action="store_true", help="print JSON")
    hs.set_defaults(func=cmd_handles)

    rl = sub.add_parser("release", help="let a handle go (its readers get `released`)")
    _consumer_options(rl)
    rl.add_argument("handle", help="the handle's URL or id")
    rl.set_defaults(func=cmd_release)


__all__ = ["add_consumer_commands", "cmd_request", "cmd_read", "cmd_handles", "cmd_release",
           "RowWriter", "Progress", "describe_event"]
