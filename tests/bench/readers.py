"""The reader process of the benchmarks: handles of a gateway read as NDJSON over raw sockets,
many per process (a selector), each row's latency taken from its `sent`, events counted.

`python tests/bench/readers.py --read JOB` (see `ReadJob`; `start_reader` starts it). Only the
standard library, so that it starts fast.
"""
from __future__ import annotations

import json
import os
import random
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

FINAL_EVENTS = ("revoked", "released", "ended", "shutdown")


# A row line and the two numbers it is measured by (the gateway writes compact JSON: no space
# after a colon), found with one regex scan per received chunk rather than a Python loop per row:
# at 100,000 rows/s a per-row loop made four reader processes take half a core of the two that
# the gateway they measure runs on.
ROW_LINE = re.compile(rb'^\{"id":[0-9]+,"row":', re.M)
SENT = re.compile(rb'"sent":(-?[0-9][0-9.eE+-]*)')
SEQ = re.compile(rb'"seq":(-?[0-9]+)')
RETRY_AFTER = re.compile(rb'\r\nretry-after: *([0-9]+)', re.I)


@dataclass
class ReadJob:
    """What one reader process reads: handles (index, path, token) of the gateway at host:port,
    each as NDJSON over a raw socket (HTTP/1.0: the stream ends with the connection).
    A handle is done at its final event (revoked, released, ended, shutdown), at `want` rows
    (and rows reported lost), or when the connection ends; the process at `seconds`, at SIGTERM,
    or when every handle is done. With `phases` ((lo, hi) epoch ranges of the rows' `sent`) every
    row's latency (arrival - sent) is kept under its phase; with `sample`, (index, seq, arrival)
    of the rows with seq % sample == 0. With `retry`, a handle answered 429 or 503 with
    `Retry-After` (a server at its connection limit, an edge whose store check did not come in
    time or that cannot reach the brokers) is asked again after that many seconds (and up to
    as many more, spread), as a client is told to, until `seconds` end; each such answer is
    counted in `refused` (by status), not in `errors`."""

    host: str
    port: int
    handles: list[tuple[int, str, str]]
    out: str
    ready: str | None = None
    want: int | None = None
    seconds: float = 600.0
    phases: list[tuple[float, float]] = field(default_factory=list)
    sample: int = 0
    start_file: str | None = None  # phases are offsets from the epoch second written there
    retry: bool = False


def write_start(job: ReadJob, epoch: float) -> None:
    """Tell a reader whose phases are relative (`start_file`) when its run starts."""
    assert job.start_file is not None
    tmp = Path(job.start_file + ".tmp")
    tmp.write_text(repr(epoch))
    os.replace(tmp, job.start_file)


def handle_path(url: str) -> str:
    """A handle's path (`/handles/<id>`) from its URL or id."""
    return urlsplit(url).path if "://" in url else f"/handles/{url}"


def start_reader(job: ReadJob) -> subprocess.Popen[bytes]:
    submit(job)
    return spawn_reader(job.out)


def spawn_reader(out: str) -> subprocess.Popen[bytes]:
    """A reader process that waits for its job (`submit`): started before the handle is
    opened, so that the reader's own start (a Python process: 0.1-1 s) is not counted in a
    first row's wait."""
    job = str(Path(out).with_suffix(".job"))
    return subprocess.Popen([sys.executable, __file__, "--read", job], stdin=subprocess.DEVNULL)


def submit(job: ReadJob) -> None:
    path = Path(job.out).with_suffix(".job")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(job)))
    os.replace(tmp, path)


def wait_ready(job: ReadJob, timeout: float = 120.0) -> bool:
    """Until the reader has every handle's response head (its `ready` file)."""
    assert job.ready is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(job.ready).exists():
            return True
        time.sleep(0.05)
    return False


def reader_result(proc: subprocess.Popen[bytes], job: ReadJob, timeout: float,
                  stop: bool = False) -> dict[str, Any]:
    """The reader's figures, once it ended (or, with `stop`, after SIGTERM now)."""
    if stop and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    try:
        return json.loads(Path(job.out).read_text())
    except (OSError, ValueError):
        return {"rows": 0, "lat": [[] for _ in job.phases], "errors": ["no output"],
                "first": None, "last": None, "gaps": 0, "lost": 0, "revoked": [],
                "after_final": 0, "still_open": len(job.handles), "samples": [], "finals": {}}


class _Conn:
    __slots__ = ("index", "sock", "pending", "head", "final", "rows", "lost", "top")

    def __init__(self, index: int, sock: socket.socket) -> None:
        self.index, self.sock = index, sock
        self.pending = b""
        self.head = False
        self.final: str | None = None
        self.rows = 0
        self.lost = 0
        self.top = -1  # the highest `seq` of the rows it got


def reader_main(job_path: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    waited = time.monotonic() + 600
    while not Path(job_path).exists():  # spawned ahead of its job (`spawn_reader`)
        if stop.is_set() or time.monotonic() > waited:
            return
        time.sleep(0.005)
    job = ReadJob(**json.loads(Path(job_path).read_text()))
    deadline = time.monotonic() + job.seconds
    sel = selectors.DefaultSelector()
    conns: dict[int, _Conn] = {}
    requests = {index: (path, token) for index, path, token in job.handles}
    again: list[tuple[float, int]] = []  # (monotonic time, handle index) to ask again
    refused: dict[str, int] = {}

    def connect(index: int) -> None:
        path, token = requests[index]
        s = socket.create_connection((job.host, job.port), timeout=30)
        s.sendall(f"GET {path} HTTP/1.0\r\nAccept: application/x-ndjson\r\n"
                  f"Authorization: Bearer {token}\r\n\r\n".encode())
        s.setblocking(False)
        conns[index] = _Conn(index, s)
        sel.register(s, selectors.EVENT_READ, index)

    for index in requests:
        connect(index)
    phases = [tuple(p) for p in job.phases]
    relative = job.start_file is not None

    def resolve() -> bool:
        """Relative phases made absolute once the start is known."""
        nonlocal phases, relative
        try:
            start = float(Path(job.start_file).read_text())  # type: ignore[arg-type]
        except (OSError, ValueError):
            return False
        phases = [(start + lo, start + hi) for lo, hi in phases]
        relative = False
        return True
    lat: list[list[float]] = [[] for _ in phases]
    samples: list[tuple[int, int, float]] = []
    revoked: list[float] = []
    finals: dict[str, int] = {}
    reasons: dict[str, int] = {}  # final events by kind and reason
    out = {"rows": 0, "gaps": 0, "lost": 0, "after_final": 0}
    first: float | None = None
    last: float | None = None
    errors: list[str] = []
    ready_written = job.ready is None

    tops: dict[int, tuple[int, int]] = {}  # per handle index: (rows, highest seq)

    def close(c: _Conn) -> None:
        out["lost"] += c.lost
        tops[c.index] = (c.rows, c.top)
        sel.unregister(c.sock)
        c.sock.close()
        del conns[c.index]

    while not stop.is_set() and (conns or again) and time.monotonic() < deadline:
        if relative:
            resolve()
        now = time.monotonic()
        if again and again[0][0] <= now:
            # one clock reading for both halves: an entry falling due between two readings
            # would be in neither, its handle never asked again
            due = [i for at, i in again if at <= now]
            again = [(at, i) for at, i in again if at > now]
            for index in due:
                try:
                    connect(index)
                except OSError as exc:
                    errors.append(f"handle {index}: asked again: {exc!r}")
        if not ready_written and not again and all(c.head for c in conns.values()):
            Path(job.ready).write_text("ready")  # type: ignore[arg-type]
            ready_written = True
        for key, _ in sel.select(0.2):
            c = conns.get(key.data)
            if c is None:
                continue
            try:
                data = c.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError as exc:
                data = b""
                errors.append(repr(exc))
            now = time.time()
            if not data:
                close(c)
                continue
            buf = c.pending + data
            if not c.head:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    c.pending = buf
                    continue
                if b" 200 " not in buf[:20]:
                    status = buf[9:12].decode(errors="replace")
                    wait = RETRY_AFTER.search(buf[:end])
                    if job.retry and status in ("429", "503") and wait:
                        refused[status] = refused.get(status, 0) + 1
                        pause = float(wait.group(1))
                        again.append((time.monotonic() + pause * (1 + random.random()),
                                      c.index))
                        again.sort()
                    else:
                        errors.append(buf[:300].decode(errors="replace"))
                    close(c)
                    continue
                buf = buf[end + 4:]
                c.head = True
            cut = buf.rfind(b"\n") + 1
            chunk, c.pending = buf[:cut], buf[cut:]
            if c.final is not None:
                out["after_final"] += len(ROW_LINE.findall(chunk))
                continue
            if b'"event":' in chunk:  # events are rare: those lines are parsed whole
                at = 0
                for line in chunk.split(b"\n"):
                    at += len(line) + 1
                    if not line.startswith(b'{"id":') or b',"row":' in line[:32]:
                        continue
                    obj = json.loads(line)
                    kind = obj.get("event")
                    if kind == "gap":
                        out["gaps"] += 1
                        c.lost += obj.get("lost") or 0
                    elif kind in FINAL_EVENTS:
                        c.final = kind
                        finals[kind] = finals.get(kind, 0) + 1
                        said = f"{kind}: {obj.get('reason')}"[:200]
                        reasons[said] = reasons.get(said, 0) + 1
                        if kind == "revoked":
                            revoked.append(now)
                        out["after_final"] += len(ROW_LINE.findall(chunk, at))
                        chunk = chunk[:at]
                        break
            n = len(ROW_LINE.findall(chunk))
            if n:
                c.rows += n
                out["rows"] += n
                first = first or now
                last = now
                if relative and not resolve():
                    errors.append("rows before the run's start was known")
                elif phases:
                    sents = SENT.findall(chunk)
                    if len(sents) != n:
                        errors.append(f"a row without `sent` in {chunk[:200]!r}")
                    else:
                        for sent_text in sents:
                            sent = float(sent_text)
                            for k, (lo, hi) in enumerate(phases):
                                if lo <= sent < hi:
                                    lat[k].append(now - sent)
                                    break
                seqs = SEQ.findall(chunk)
                if seqs:
                    c.top = max(c.top, *(int(t) for t in seqs))
                if job.sample:
                    for seq_text in seqs:
                        seq = int(seq_text)
                        if seq % job.sample == 0:
                            samples.append((c.index, seq, now))
            if c.final is None and job.want is not None and c.rows + c.lost >= job.want:
                close(c)  # (after a final event the gateway ends the stream: read until then)
    still_open = len(conns)
    for c in list(conns.values()):
        close(c)
    if not ready_written and job.ready:
        Path(job.ready).write_text("ended before every head arrived")
    Path(job.out).write_text(json.dumps({
        **out, "lat": lat, "first": first, "last": last, "revoked": revoked, "finals": finals,
        "samples": samples, "errors": errors[:5], "still_open": still_open,
        "tops": {str(i): t for i, t in tops.items()}, "reasons": reasons,
        "refused": refused, "never_served": len(again)}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--read"] and len(sys.argv) == 3:
        reader_main(sys.argv[2])
    else:
        sys.exit("usage: readers.py --read JOB (the reader process; see ReadJob)")
