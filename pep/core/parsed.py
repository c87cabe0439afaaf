"""A bounded memo of parsed access requests, for passes that decide the same stored requests
again and again (revocation: a policy deleted under a thousand live handles decides each
handle's request again; parsing its XACML body and user query was a third of that pass).

A handle's stored request (body, media type, user query and its type) never changes, and
parsing is a pure function of those bytes, so the parsed forms can be shared:
- the XACML request context (`pdp.parse_request`), keyed by (body, media type);
- the user query (`pep.core.userquery`), keyed by all four: a query in the request's resource
  Content comes from the body, one beside it from its own bytes.
Nothing identity-bound is kept: the subject, the environment and the join are bound to a copy
at every decision (`pdp.bind_subject` and the others build new contexts and never change the
one they are given), and a `UserQuery` is frozen. Only what parsed is kept: a request or query
that does not parse is parsed (and refused) again every time, with a fresh refusal, exactly as
without the memo.

Bounded by entries and by the bytes of the keys, least recently used first out; a request of
more than `max_entry_bytes` is not kept (bodies may be megabytes, and parsed they take several
times that). Sized for a few thousand live handles: a pass over more handles than it holds
misses on most of them (a scan larger than an LRU), and parses them as it did without it.
Thread-safe (a pass, a dry run and a request may share it).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar, cast

DEFAULT_MAX_ENTRIES = 8192
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_ENTRY_BYTES = 64 * 1024

MemoKey = tuple[bytes | str | None, ...]
"""What a parsed form is kept by: the kind of form first ("request", "query"), then the bytes
and texts it was parsed from (None where a part is absent)."""
T = TypeVar("T")


class ParsedRequests:
    """Parsed forms by the bytes they were parsed from (see the module docstring)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1 or max_entry_bytes < 1:
            raise ValueError("a memo of parsed requests needs max_entries, max_bytes and "
                             "max_entry_bytes >= 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        # key -> (parsed form, bytes of the key): forms of several types, each under keys of
        # its own kind (the key's first part)
        self._entries: OrderedDict[MemoKey, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_parse(self, key: MemoKey, parse: Callable[[], T]) -> T:
        """The parsed form for `key` (a tuple of bytes, str and None), `parse()` when it is not
        kept yet. An exception from `parse` passes through and nothing is kept."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return cast(T, found[0])  # kept by a `parse` of the form its key names
            self.misses += 1
        value = parse()  # outside the lock: parsing a large body must not hold up others
        self._put(key, value)
        return value

    def fill_only(self) -> FillOnly:
        """A view that parses every time and keeps what parsed, never answering from the memo:
        for a request whose caller must not be able to tell, by its timing, whether somebody
        else sent the same bytes before (`POST /requests`), while the revocation passes that
        will decide its handle again find it parsed."""
        return FillOnly(self)

    def _put(self, key: MemoKey, value: object) -> None:
        size = sum(len(part) for part in key if isinstance(part, (bytes, str)))
        if size > self.max_entry_bytes:
            return  # a large request: not kept (see the module docstring)
        with self._lock:
            if key in self._entries:
                return  # another thread parsed it meanwhile: keep the first
            self._entries[key] = (value, size)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


class FillOnly:
    """`ParsedRequests.fill_only`: parses always, keeps what parsed."""

    def __init__(self, memo: ParsedRequests) -> None:
        self._memo = memo

    def get_or_parse(self, key: MemoKey, parse: Callable[[], T]) -> T:
        value = parse()
        self._memo._put(key, value)
        return value


RequestMemo = ParsedRequests | FillOnly


__all__ = ["ParsedRequests", "FillOnly", "RequestMemo", "MemoKey", "DEFAULT_MAX_ENTRIES",
           "DEFAULT_MAX_BYTES", "DEFAULT_MAX_ENTRY_BYTES"]
