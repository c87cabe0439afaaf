"""Real-time mode (issue 45): a Kafka stream whose plans all compile to Spark expressions runs
one real-time query (`trigger(realTime=...)`, Spark 4.1+: long-running tasks that read, filter
and write each record as it comes, milliseconds instead of a micro-batch's floor) from its
topic straight to the plan topics, instead of the micro-batches and their foreachBatch.

What real-time mode allows (Spark 4.2's allowlist, `RealTimeModeAllowlist`): projections,
filters, `explode`, unions of distinct sources, broadcast hash joins with a local table,
observations; the Kafka sink (and `foreach`, console, memory), never `foreachBatch`; output mode
update; no Python UDF (`mapInArrow`, pandas or Arrow UDFs are not on the list), no shuffle, no
window function, no state. So the query is, per record: the few plans' filters as one Column
(`plan_expressions.few_plans_column`, the micro-batch rows job's own tests), the ids of the
plans it passes exploded, a broadcast join with the small (plan id, topic, projection) table,
the value as the micro-batch writer encodes it (`TopicRows.value_column`) and the key
`r:<epoch>:<source topic>/<partition>/<offset>`: the record's place in the stream's topic. There
is no row number within a batch (a window function), so a replay after a restart is told by
that place: per source partition the records come in offset order, and an edge skips a record
whose source offset is not above the last one it read of that partition (`pep.edge.reader`).

A stream qualifies (`refusal` says why not) when every plan on it is a row plan (no window, no
member of a union of grants), compares only numbers, integers, strings and labels (no spatial
predicate, no masked comparison), masks nothing, has no security punctuations, there are at most
`FEW_PLANS` of them (more go to the grouped matcher, which runs in Python on the workers) and
every handle reads a plan topic. Real-time tasks hold one task slot per source partition for
the whole batch: the query also needs more slots than the topic has partitions (one left for
the gateway's other queries).

The plans are literals of the query: a plan that comes or goes restarts it (`RealTimeMode`,
`realtime_mode.py`, which also keeps a change of mode from repeating rows).

Holes: without a row number an edge cannot tell a record lost on its way from a record that
never passed. So the query also counts, per plan topic, the records it writes in each batch
(`DataFrame.observe`, on the allowlist: the counts come with the batch's progress, from tasks
that ended, after their producer flushed), and the gateway writes after each batch a count
marker to each plan topic (`count_key`, `marker_value`: the batch's source offset ranges and
the topic's count, never a row); an edge compares it with the records it read in those ranges
(`pep.edge.reader.CountLog`; `realtime_mode.CountMarkers` writes them).
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, functions as F
from pyspark.sql.streaming.query import StreamingQuery

from pep.delivery.settings import COUNT_KIND
from pep.runtime.base.columns import FILE_COLUMN, PIDS_COLUMN
from pep.runtime.delivery.topic_rows import PID, TOPIC, PlanRoute, TopicRows
from pep.runtime.delivery.writer import topic_of
from pep.runtime.plans.compile import INTEGER_KIND, LABEL_KIND, NUMERIC_KIND, STRING_KIND
from pep.runtime.plans.plan_expressions import FEW_PLANS, few_plans_column

NATIVE_KINDS = frozenset({NUMERIC_KIND, STRING_KIND, INTEGER_KIND, LABEL_KIND})
REALTIME_KEY = "r"
COUNTS = "xsg_realtime_counts"  # the observation of the records written per plan topic


def realtime_key(epoch: str) -> str:
    """The keys' common part of a real-time query (`r:<epoch>:`); the source record's
    `<topic>/<partition>/<offset>` follows."""
    return f"{REALTIME_KEY}:{epoch}:"


def source_place(key: bytes | None) -> tuple[str, int, int] | None:
    """(epoch, source partition, source offset) of a key `realtime_key` began; None for
    another key."""
    try:
        kind, epoch, place = (key or b"").decode("ascii").split(":")
        _topic, partition, offset = place.rsplit("/", 2)
        return (epoch, int(partition), int(offset)) if kind == REALTIME_KEY else None
    except ValueError:
        return None


def count_key(epoch: str, mark: str) -> bytes:
    """The key of a count marker (`c:<epoch>:<mark>`): `mark` names it among the epoch's
    markers of the topic (`b<batch>` after a batch, `o<random>` before a query starts)."""
    return f"{COUNT_KIND}:{epoch}:{mark}".encode("ascii")


def marker_value(ranges: dict[str, tuple[int, int]] | None, rows: int | None,
                 after: str | None) -> bytes:
    """A count marker's value: the batch's source offset ranges (`<topic>/<partition>` ->
    [first, end)), the records written to the topic from them, and `after`: a marker of the
    topic that was on the brokers before the batch's first record could be written (None: none
    known; an edge checks a batch only when it read that marker, so it read the whole batch).
    An opening marker has no ranges."""
    out: dict[str, Any] = {"after": after}
    if ranges is not None:
        out["ranges"] = {p: [first, end] for p, (first, end) in sorted(ranges.items())}
        out["rows"] = int(rows or 0)
    return json.dumps(out, separators=(",", ":")).encode("utf-8")


def batch_ranges(sources: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """Per source `<topic>/<partition>`, the offsets [first, end) a batch read, from its
    progress's sources (`startOffset` is null for a new checkpoint's first batch: from 0, the
    epoch has no records before it)."""
    out: dict[str, tuple[int, int]] = {}
    for source in sources:
        ends = _offsets(getattr(source, "endOffset", None))
        starts = _offsets(getattr(source, "startOffset", None))
        for topic, partitions in ends.items():
            for partition, end in partitions.items():
                first = int(starts.get(topic, {}).get(partition, 0))
                out[f"{topic}/{int(partition)}"] = (first, int(end))
    return out


def _offsets(text: Any) -> dict[str, dict[str, int]]:
    """A Kafka source's offsets JSON (`{"topic": {"0": 5}}`); {} for null or another
    source's."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(t): {str(p): int(o) for p, o in ps.items()}
            for t, ps in value.items() if isinstance(ps, dict)}


def refusal(plans: Sequence[Any], punctuated: bool) -> str | None:
    """Why a stream with these plan states (`PlanRegistry`'s) cannot run in real-time mode;
    None when it can (the module docstring)."""
    if not plans:
        return "no plan"
    if punctuated:
        return "the stream has security punctuations (its shield runs on the driver)"
    if len(plans) > FEW_PLANS:
        return (f"{len(plans)} plans: more than {FEW_PLANS} are matched by the grouped matcher, "
                "in Python on the workers")
    for state in plans:
        compiled = state.compiled
        if compiled.window is not None or state.windows is not None:
            return "a window plan (its windows are finished on the driver)"
        if state.unions:
            return "a union of grants (its members' rows are merged on the driver)"
        if compiled.masks:
            return "a plan masks attributes (its masks come from the plan table)"
        if compiled.punctuations is not None:
            return "the stream has security punctuations (its shield runs on the driver)"
        if any(row[2] not in NATIVE_KINDS for conj in compiled.conjuncts for row in conj):
            return "a spatial or masked comparison (read from the plan table)"
        if not state.handles or not all(topic_of(h.deliver) for h in state.handles.values()):
            return "a handle is read in the gateway process, not from a plan topic"
    return None


def ensure_epoch(checkpoint: Path) -> str:
    """The checkpoint's identity as `QueryLifecycle.checkpoint_id` reads it, written first when
    the checkpoint is new (Spark's own `metadata` file, `{"id": ...}`, which Spark then keeps):
    a real-time query's keys are fixed before it starts."""
    metadata = checkpoint / "metadata"
    if not metadata.exists():
        checkpoint.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint / ".metadata.xsg"
        tmp.write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n", encoding="utf-8")
        tmp.replace(metadata)
    return str(json.loads(metadata.read_text(encoding="utf-8").splitlines()[0])["id"]
               ).replace("-", "")[:12]


def routes_key(routes: Sequence[PlanRoute], plans: Sequence[Any]) -> tuple[Any, ...]:
    """What the running query was built from: a change of it restarts the query."""
    cuts = {s.id: (s.compiled.key, s.compiled.start_offsets) for s in plans}
    return tuple((r, cuts.get(r.pid)) for r in routes)


def counted_topics(routes: Sequence[PlanRoute]) -> list[str]:
    """The plan topics in the order of the query's counts (`COUNTS`: n0, n1, ...)."""
    return sorted({t for r in routes for t in r.topics})


class RealTimeRows:
    """Builds and starts a stream's real-time query (the module docstring). `rows`: the
    micro-batch writer of the same plan topics (its routes table and value encoding);
    `batch_seconds`: the real-time batch's length (offsets are committed once per batch)."""

    def __init__(self, rows: TopicRows, options: dict[str, str], batch_seconds: float) -> None:
        self._rows = rows
        self._options = dict(options)
        self.batch_seconds = batch_seconds

    def records(self, source: DataFrame, schema: Any, plans: Sequence[Any],
                routes: Sequence[PlanRoute], epoch: str) -> DataFrame:
        """(topic, key, value) of every (record, plan topic) of the stream's Kafka frame."""
        few = few_plans_column([(s.id, s.compiled) for s in plans], schema)
        sources = sorted({c for r in routes for c in r.sources})
        passed = (source.select(*[F.col(f"`{c}`") for c in sources], F.col(FILE_COLUMN),
                                few.alias(PIDS_COLUMN))
                  .where(F.size(F.col(PIDS_COLUMN)) > 0))
        exploded = passed.select(F.explode(F.col(PIDS_COLUMN)).alias(PID),
                                 *[F.col(f"`{c}`") for c in sources], F.col(FILE_COLUMN))
        joined, value = self._rows.routed(exploded, routes)
        # counted per destination (a plan's lane, `pep.delivery.lanes`), then written to its topic
        counted = joined.observe(COUNTS, *[
            F.count(F.when(F.col(TOPIC) == topic, 1)).alias(f"n{i}")
            for i, topic in enumerate(counted_topics(routes))])
        return counted.select(*self._rows.lane_records(
            F.concat(F.lit(realtime_key(epoch)), F.col(FILE_COLUMN)), value))

    def start(self, records: DataFrame, name: str, checkpoint: Path) -> StreamingQuery:
        """The real-time query writing `records` to their topics."""
        interval = f"{max(1, int(round(self.batch_seconds * 1000)))} milliseconds"
        writer = (records.writeStream.queryName(name).format("kafka").options(**self._options)
                  .option("checkpointLocation", str(checkpoint)).outputMode("update"))
        writer = writer.trigger(realTime=interval)  # type: ignore[call-overload]  # not in pyspark 4.2's overloads
        query: StreamingQuery = writer.start()
        return query


__all__ = ["COUNTS", "NATIVE_KINDS", "REALTIME_KEY", "RealTimeRows", "batch_ranges", "count_key",
           "counted_topics", "ensure_epoch", "marker_value", "realtime_key", "refusal",
           "routes_key", "source_place"]
