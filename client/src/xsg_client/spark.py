"""A Spark data source for handles: a downstream Spark job reads the authorised stream.

    spark.readStream.format("xsg") \\
        .option("handle", "https://gateway:8080/handles/ID") \\
        .option("token", token) \\              # or the environment's XSG_TOKEN
        .load()

PySpark's Python Data Source API (4.0 and later), a streaming reader
(`SimpleDataSourceStreamReader`): the driver reads the handle (on a thread of its own, with the
client's reconnecting reader) and each micro-batch takes the events that came since the last
one. **Offsets are the handle's event ids** (`{"handle": <fingerprint>, "event_id": n}`): the
query's own checkpoint records where each batch ended, so a query restarted from its checkpoint
asks the gateway for what followed that id (`Last-Event-ID`) and continues without repeating a
row; a batch Spark must run again (logged, never committed) is read again between its two ids.
The fingerprint (the first 16 hex digits of the SHA-256 of the handle id, never the id: the id
is the handle's capability, and checkpoints are files) ties a checkpoint to its handle.

The schema is the handle's (`xsg_client.schema`: timestamps as `TIMESTAMP`, longs as `BIGINT`,
doubles, strings, booleans; a column the client cannot type is the value's JSON text), or the
one given with `.schema(...)`.

The end of the handle ends the query with an error that says it: `revoked` (with the gateway's
reason), `released`, `ended`. Rows before it are delivered first. `gap`, `stalled`, `resumed`,
lost and regained connections and the gateway's restarts are logged (logger `xsg_client.spark`),
and reading goes on.

Options (case-insensitive): `handle` (its URL, or its id with `url`), `url` (the gateway;
default: the handle URL's), `token` (default `XSG_TOKEN`), `caFile` (HTTPS with a private CA),
`startingEventId` (a new query starts after this event id; default 0: from the oldest row the
gateway still keeps), `eventIdColumn` (add each row's event id as this BIGINT column, first),
`maxRowsPerBatch` (10000), `reconnectTimeout` (seconds a lost connection is retried before the
query fails; default 300), `pollSeconds` (how long a trigger waits for the first new event when
there is none; default 0.5).

Spark finds the source by its name when xsg-client is installed (the `pyspark_xsg` module,
pyspark's lookup of `pyspark_*` modules); `register(spark)` registers it explicitly.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, SimpleDataSourceStreamReader
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from xsg_client._core import handle_ref
from xsg_client.client import Client
from xsg_client.errors import HandleEnded, XsgError
from xsg_client.events import Disconnected, End, Event, Gap, Notice, Reconnected, Row
from xsg_client.schema import HandleSchema, parse_timestamp
from xsg_client.tail import Tail

log = logging.getLogger("xsg_client.spark")

SPARK_TYPES: dict[str, DataType] = {"double": DoubleType(), "long": LongType(),
                                    "string": StringType(), "boolean": BooleanType(),
                                    "timestamp": TimestampType(), "json": StringType()}
REPLAY_IDLE = 10.0  # seconds without an event after which a batch read again is taken as all


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, read once (see the module docstring)."""

    handle: str
    url: str | None
    token: str | None
    ca_file: str | None
    starting_event_id: int
    event_id_column: str | None
    max_rows: int
    reconnect_timeout: float
    poll_seconds: float

    @classmethod
    def of(cls, options: Mapping[str, str]) -> SourceOptions:
        given = {str(k).lower(): v for k, v in options.items()}
        handle = given.get("handle")
        if not handle:
            raise XsgError('the xsg source needs the handle: .option("handle", <its URL>)')
        return cls(handle=handle, url=given.get("url"), token=given.get("token"),
                   ca_file=given.get("cafile"),
                   starting_event_id=_number(given, "startingeventid", "startingEventId", 0),
                   event_id_column=given.get("eventidcolumn") or None,
                   max_rows=_number(given, "maxrowsperbatch", "maxRowsPerBatch", 10_000, low=1),
                   reconnect_timeout=float(_number(given, "reconnecttimeout",
                                                   "reconnectTimeout", 300, low=1)),
                   poll_seconds=_seconds(given.get("pollseconds", "0.5")))

    def client(self) -> Client:
        base = self.url
        if base is None:
            ref = handle_ref(self.handle, "http://gateway.invalid")
            base = ref.url.rsplit("/handles/", 1)[0]
            if base == "http://gateway.invalid":
                raise XsgError('a handle given by its id needs the gateway: .option("url", ...)')
        return Client(base, self.token, ca_file=self.ca_file)

    def fingerprint(self) -> str:
        ref = handle_ref(self.handle, self.url or "http://gateway.invalid")
        return hashlib.sha256(ref.id.encode("utf-8")).hexdigest()[:16]


def _number(given: Mapping[str, str], key: str, name: str, default: int, low: int = 0) -> int:
    text = given.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise XsgError(f"option {name} must be a whole number, not {text!r}") from None
    if value < low:
        raise XsgError(f"option {name} must be at least {low}, not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise XsgError(f"option pollSeconds must be a number of seconds, not {text!r}") from None
    return min(max(value, 0.0), 10.0)


def spark_schema(schema: HandleSchema, event_id_column: str | None = None) -> StructType:
    """A handle's schema as Spark's (`SPARK_TYPES`), the event id column first if asked."""
    fields = [StructField(event_id_column, LongType(), False)] if event_id_column else []
    fields += [StructField(c.name, SPARK_TYPES[c.type], True) for c in schema.columns]
    return StructType(fields)


def _handle_schema(struct: StructType, event_id_column: str | None) -> HandleSchema:
    """What the client needs to type the rows of a Spark schema (timestamp columns)."""
    return HandleSchema.of((f.name, "timestamp" if isinstance(f.dataType, TimestampType)
                            else "json") for f in struct.fields if f.name != event_id_column)


class XsgDataSource(DataSource):
    """`spark.readStream.format("xsg")`: a handle of an xsg gateway, as a stream."""

    @classmethod
    def name(cls) -> str:
        return "xsg"

    def schema(self) -> StructType:
        options = SourceOptions.of(self.options)
        with options.client() as client:
            info = client.describe(options.handle)
            return spark_schema(client.schema(info.plan), options.event_id_column)

    def reader(self, schema: StructType) -> DataSourceReader:
        raise XsgError('a handle is a stream: read it with spark.readStream.format("xsg")')

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return HandleStreamReader(SourceOptions.of(self.options), schema)


class HandleStreamReader(SimpleDataSourceStreamReader):
    """Reads one handle for one streaming query (see the module docstring)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.struct = schema
        self.handle_schema = _handle_schema(schema, options.event_id_column)
        self.fingerprint = options.fingerprint()
        self._converters = [(f.name, _converter(f.dataType)) for f in schema.fields]
        self._client: Client | None = None
        self._tail: Tail | None = None
        self._position: int | None = None  # the id the tail's next event follows
        self._ended: End | None = None  # came after rows: the next read raises it

    def initialOffset(self) -> dict[str, Any]:
        return self._offset(self.options.starting_event_id)

    def _offset(self, event_id: int) -> dict[str, Any]:
        return {"handle": self.fingerprint, "event_id": int(event_id)}

    def _event_id(self, offset: Mapping[str, Any]) -> int:
        if offset.get("handle") != self.fingerprint:
            raise XsgError("this query's checkpoint was written for another handle; give the "
                           "query a checkpoint location of its own for this handle")
        event_id = offset.get("event_id")
        if not isinstance(event_id, int) or event_id < 0:
            raise XsgError(f"not an offset of the xsg source: {json.dumps(dict(offset))}")
        return event_id

    def _row(self, event: Row) -> tuple[Any, ...]:
        values = event.values
        return tuple(event.id if name == self.options.event_id_column else convert(values.get(name))
                     for name, convert in self._converters)

    def _tail_after(self, event_id: int) -> Tail:
        if self._tail is not None and self._position == event_id and not self._tail.finished:
            return self._tail
        if self._tail is not None:
            self._tail.close()
        if self._client is None:
            self._client = self.options.client()
        stream = self._client.open(self.options.handle, last_event_id=event_id or None,
                                   schema=self.handle_schema,
                                   reconnect_timeout=self.options.reconnect_timeout)
        self._tail = Tail(stream)
        self._tail.start()
        self._position = event_id
        return self._tail

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        """The rows that came after `start`, and the id of the last event taken."""
        cursor = self._event_id(start)
        if self._ended is not None:
            raise HandleEnded(self._ended.kind, self._ended.reason)
        tail = self._tail_after(cursor)
        rows: list[tuple[Any, ...]] = []
        end = cursor
        for event in tail.poll(self.options.poll_seconds, self.options.max_rows):
            if isinstance(event, Row):
                rows.append(self._row(event))
                end = event.id
            elif isinstance(event, End):
                if not rows:
                    raise HandleEnded(event.kind, event.reason)
                self._ended = event  # rows first; the next trigger fails the query
                break
            else:
                end = _logged(event, end)
        self._position = end
        return iter(rows), self._offset(end)

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]
                           ) -> Iterator[tuple[Any, ...]]:
        """A batch run again (it was logged, not committed): its rows, read again from the
        gateway between the two ids. Rows the gateway no longer holds are reported (a gap) and
        left out."""
        first, last = self._event_id(start), self._event_id(end)
        rows: list[tuple[Any, ...]] = []
        if last <= first:
            return iter(rows)
        with self.options.client() as client:
            stream = client.open(self.options.handle, last_event_id=first or None,
                                 schema=self.handle_schema, idle_timeout=REPLAY_IDLE,
                                 reconnect_timeout=self.options.reconnect_timeout)
            reached = False
            for event in stream.events():
                event_id = getattr(event, "id", None)
                if isinstance(event_id, int) and event_id > last:
                    reached = True  # past the batch: the rest belongs to later batches
                    break
                if isinstance(event, Row):
                    rows.append(self._row(event))
                elif isinstance(event, End):
                    break
                else:
                    _logged(event, first)
                if event_id == last:
                    reached = True
                    break
            stream.close()
        if not reached:
            log.warning("a micro-batch of handle %s read again ended before event %d: the "
                        "gateway holds no more of it (%d rows read again)", self.fingerprint,
                        last, len(rows))
        return iter(rows)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to acknowledge: the gateway keeps a ring of recent rows per handle, and a
        reader's place is the id it asks from."""

    def stop(self) -> None:
        if self._tail is not None:
            self._tail.close()
        if self._client is not None:
            self._client.close()


def _logged(event: Event, end: int) -> int:
    """Log an event that is not a row; the offset after it."""
    if isinstance(event, Gap):
        log.warning("handle stream gap: %s rows lost (%s); resuming at event %s",
                    "an unknown number of" if event.lost is None else event.lost,
                    event.reason, event.resume_from)
        return event.id
    if isinstance(event, Notice):
        log.warning("handle stream notice %r: %s", event.kind, json.dumps(event.data))
        return event.id
    if isinstance(event, Disconnected):
        log.warning("handle stream lost (%s); trying again in %.1f s", event.cause,
                    event.retry_in)
    elif isinstance(event, Reconnected):
        log.info("handle stream read again after event %s (%.1f s without)",
                 event.last_event_id, event.outage)
    return end


def _converter(kind: DataType) -> Callable[[Any], Any]:
    """How a row's value becomes the value of a Spark column of this type."""
    if isinstance(kind, TimestampType):
        return lambda v: parse_timestamp(v) if isinstance(v, str) else v
    if isinstance(kind, StringType):
        return lambda v: v if v is None or isinstance(v, str) else (
            v.isoformat() if isinstance(v, datetime) else json.dumps(v))
    if isinstance(kind, DoubleType):
        return lambda v: None if v is None else float(v)
    return lambda v: v


def register(spark: SparkSession) -> None:
    """Register the source with a session (when pyspark's lookup of installed sources is
    not used)."""
    spark.dataSource.register(XsgDataSource)


__all__ = ["XsgDataSource", "HandleStreamReader", "SourceOptions", "register", "spark_schema",
           "SPARK_TYPES"]
