"""An append-only audit log in JSON lines, rotated by size, queryable by time, kind and stream.

Every entry is one line: `{"time": ISO-8601 UTC, "seq": n, "kind": ..., ...fields}`. `seq` grows
by one per entry and survives restarts (it is read back from the newest file at start), so a
reader can tell whether entries are missing. What an entry never holds: bearer tokens, handle ids
(the capability's secret part: a handle appears as `handle_ref`, a short hash its owner can match
against GET /handles), request bodies, or any value of a stream's data.

Files: `audit.log` is written; when it passes `max_bytes` it becomes `audit.log.1` (the older
ones shift up) and the oldest beyond `keep` files is removed. Lines are flushed (and fsynced when
`durable`) before `record` returns; `record_many` writes a batch with one fsync (a batch may
overrun `max_bytes` before the file rotates).
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from pep.audit.views import AuditEntry, EntryView, entry_streams
from pep.core.jsontypes import JsonValue
from pep.core.refs import handle_ref  # the audit's name for a handle (re-exported)

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_KEEP = 10
FORBIDDEN_FIELDS = frozenset({"token", "authorization", "body", "handle_id", "rows", "row"})


# json.dumps with these options would build an encoder per entry; one pass can write a thousand
_ENCODE = json.JSONEncoder(separators=(",", ":"), default=str).encode


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuditRecords(Protocol):
    """What the audit trail writes to and GET /audit reads: this module's files, or a table of
    the store (`pep.audit.table.AuditTable`, with a PostgreSQL store)."""

    def record(self, kind: str, **fields: JsonValue) -> AuditEntry: ...

    def record_many(self, items: Iterable[tuple[str, AuditEntry]]) -> list[AuditEntry]: ...

    def entries(self) -> Iterator[AuditEntry]: ...

    def query(self, *, kinds: Iterable[str] | None = None, stream: str | None = None,
              subject: str | None = None, since: str | None = None, until: str | None = None,
              after_seq: int | None = None, view: EntryView | None = None,
              limit: int = 1000) -> list[AuditEntry]: ...

    def close(self) -> None: ...


def checked(items: Iterable[tuple[str, AuditEntry]]) -> list[tuple[str, AuditEntry]]:
    """The entries to write, all checked before any is: fields that could hold secrets are
    refused (ValueError)."""
    items = list(items)
    for _, fields in items:
        bad = FORBIDDEN_FIELDS.intersection(k.lower() for k in fields)
        if bad:
            raise ValueError(f"audit entries never hold {', '.join(sorted(bad))}")
    return items


def new_entry(now: str, seq: int, kind: str, fields: AuditEntry) -> AuditEntry:
    """An entry as it is written: time, seq, kind, then its fields that are set."""
    return {"time": now, "seq": seq, "kind": kind,
            **{k: v for k, v in fields.items() if v is not None}}


def encode(entry: AuditEntry) -> str:
    """An entry as one line of JSON (ASCII, json's default: any text fits, a lone surrogate
    included)."""
    return _ENCODE(entry)


def matches(entry: AuditEntry, kinds: set[str] | None, stream: str | None, subject: str | None,
            since: str | None, until: str | None, after_seq: int | None) -> bool:
    """Does the entry pass a query's filters (`AuditLog.query`)?"""
    if kinds is not None and entry.get("kind") not in kinds:
        return False
    if stream is not None and stream not in entry_streams(entry):
        return False
    if subject is not None and entry.get("subject") != subject:
        return False
    time = entry.get("time", "")
    if since is not None and time < since:
        return False
    if until is not None and time >= until:
        return False
    return after_seq is None or int(entry.get("seq", 0)) > after_seq


class AuditLog:
    """Thread-safe writer and reader of the audit files in one directory."""

    def __init__(self, directory: str | Path, max_bytes: int = DEFAULT_MAX_BYTES,
                 keep: int = DEFAULT_KEEP, durable: bool = True) -> None:
        if max_bytes < 1024 or keep < 1:
            raise ValueError("an audit log needs max_bytes >= 1024 and keep >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "audit.log"
        self.max_bytes = max_bytes
        self.keep = keep
        self.durable = durable
        self._lock = threading.Lock()
        self._seq = self._last_seq()
        self._file = open(self.path, "a", encoding="utf-8")

    def _last_seq(self) -> int:
        for path in self.files()[::-1]:
            last = None
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.strip():
                        last = line
            if last is not None:
                try:
                    return int(json.loads(last).get("seq", 0))
                except (ValueError, AttributeError):
                    return 0
        return 0

    def files(self) -> list[Path]:
        """Oldest first."""
        rotated = sorted((p for p in self.directory.glob("audit.log.*")
                          if p.suffix.lstrip(".").isdigit()),
                         key=lambda p: -int(p.suffix.lstrip(".")))
        return rotated + ([self.path] if self.path.exists() else [])

    def record(self, kind: str, **fields: JsonValue) -> AuditEntry:
        """Append one entry; returns it. Fields that could hold secrets are refused."""
        return self.record_many([(kind, fields)])[0]

    def record_many(self, items: Iterable[tuple[str, AuditEntry]]) -> list[AuditEntry]:
        """Append entries (kind, fields) with one write and one fsync: a revocation of a
        thousand handles must not wait for a thousand disk flushes. All or none are checked
        before anything is written."""
        items = checked(items)
        entries = []
        with self._lock:
            now = _now()
            lines = []
            for kind, fields in items:
                self._seq += 1
                entry = new_entry(now, self._seq, kind, fields)
                entries.append(entry)
                lines.append(encode(entry) + "\n")
            if not lines:
                return entries
            self._file.write("".join(lines))
            self._file.flush()
            if self.durable:
                os.fsync(self._file.fileno())
            if self._file.tell() >= self.max_bytes:
                self._rotate()
        return entries

    def _rotate(self) -> None:
        self._file.close()
        for path in self.directory.glob("audit.log.*"):
            suffix = path.suffix.lstrip(".")
            if suffix.isdigit() and int(suffix) >= self.keep - 1:
                path.unlink(missing_ok=True)
        for n in range(self.keep - 2, 0, -1):
            older = self.directory / f"audit.log.{n}"
            if older.exists():
                os.replace(older, self.directory / f"audit.log.{n + 1}")
        if self.keep > 1:
            os.replace(self.path, self.directory / "audit.log.1")
        else:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def entries(self) -> Iterator[AuditEntry]:
        """Every entry still kept, oldest first (a line that does not parse is skipped)."""
        with self._lock:
            self._file.flush()
            paths = self.files()
        for path in paths:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        try:
                            entry = json.loads(line)
                        except ValueError:
                            continue
                        if isinstance(entry, dict):
                            yield entry
            except FileNotFoundError:  # rotated away meanwhile
                continue

    def query(self, *, kinds: Iterable[str] | None = None, stream: str | None = None,
              subject: str | None = None, since: str | None = None, until: str | None = None,
              after_seq: int | None = None, view: EntryView | None = None,
              limit: int = 1000) -> list[AuditEntry]:
        """Matching entries, newest last, at most `limit` (the newest ones). `view(entry)` gives
        what the caller may see of an entry (None: nothing; `pep.audit.views`). `stream`
        matches an entry about that stream, either side of a join included
        (`pep.audit.views.entry_streams`)."""
        wanted = set(kinds) if kinds else None
        out: list[AuditEntry] = []
        for entry in self.entries():
            if not matches(entry, wanted, stream, subject, since, until, after_seq):
                continue
            seen = view(entry) if view is not None else entry
            if seen is None:
                continue
            out.append(seen)
            if len(out) > limit:
                out.pop(0)
        return out

    def close(self) -> None:
        with self._lock:
            self._file.close()


__all__ = ["AuditLog", "AuditRecords", "checked", "encode", "handle_ref", "matches",
           "new_entry"]
