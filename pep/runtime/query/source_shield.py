"""The Security Shield of a `files` or `kafka` stream whose owner enabled security punctuations
(`docs/punctuations.md`, "Files and Kafka streams"). Their records reach Spark without passing
through the gateway, so the shield learns the punctuations inside each micro-batch.

Each record has a lane and a place in it (`sources/frames.py`): a Kafka record its partition and
offset, a file's line its file and line number. A punctuation governs the tuples after it in
its own lane only: Kafka has no order across partitions, and Spark reads the files of a batch
in parallel, in no order the producer controls. The lanes are laid side by side on one axis
(`_xsg_seq` = lane << LANE_BITS + place) and each lane starts with no punctuation, so the
ingest streams' `BatchShield` (`query/shield.py`: the tuple predicates matched in Spark, the
verdict per plan in routing, the window filter in the panes job) applies unchanged. Per batch:

- one small aggregate over the batch, on Spark's workers, brings back per lane its first and
  last place and its `$punctuation` records (never a tuple);
- a Kafka partition's punctuations are kept, by offset, in the stream's punctuation log under
  the runtime's work directory (fsynced before the batch's rows are routed), with the highest
  offset read in each partition (now and then, and at a stop). A batch run again after a crash
  reads the same offsets, finds the same punctuations at the same places, and gets the same
  segments; a query that starts anew (its checkpoint dropped) or skipped offsets reads the
  records between the last offset the log knows and the batch's first with a bounded Kafka
  read, punctuations only, so no punctuation is ever missed. Records the topic no longer holds
  may have been punctuations: the partition is in doubt, as for a record that cannot be read
  (below);
- a file is read whole in one batch (`wholetext`): its segments need no state;
- the batch without its punctuation records (and, for files, its lanes numbered by their paths
  in sorted order) is what every job of the batch reads: a punctuation is never a tuple, never
  counted in a window, never moves a clock.

A `$punctuation` record that cannot be read (not a punctuation, other keys beside it, a record
that does not parse and names one) cannot be refused as the ingest refuses it: from it on its
lane's tuples reach nobody until a punctuation starts a newer policy
(`pep.core.punctuations.lane_segments`); counted, and logged once without its content.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession, functions as F

from pep.core.punctuations import (
    Punctuation,
    PunctuationError,
    SegmentPolicy,
    ShieldState,
    lane_segments,
    parse_punctuation,
)
from pep.runtime.base.columns import FILE_COLUMN, LANE_BITS, PUNCT_COLUMN, SEQ_COLUMN
from pep.runtime.query.settings import StreamLayout
from pep.runtime.query.shield import BatchShield, Conditions, match_tuples, verdict_key

log = logging.getLogger(__name__)

LOG_DIR = "punctuations"  # under the runtime's work directory: one log per Kafka stream
# offsets read in a partition before the log says so again (and when punctuations are learnt,
# and at a stop): offsets read but not logged are only read again for punctuations
SEEN_EVERY = 100_000


@dataclass
class _Lane:
    """One Kafka partition as the shield knows it: its punctuations by offset (None: a record
    that could not be read, or records gone), the highest offset read, its segments (cached)."""

    entries: dict[int, Punctuation | None] = field(default_factory=dict)
    seen: int = -1
    logged: int = -1  # the highest offset read that the log says
    cached: tuple[list[int], list[SegmentPolicy], int] | None = None

    def segments(self) -> tuple[list[int], list[SegmentPolicy], int]:
        if self.cached is None:
            state = ShieldState()
            starts, policies = lane_segments(sorted(self.entries.items()), state)
            self.cached = (starts, policies, state.discarded)
        return self.cached


class SourceShield:
    """The punctuations of one `files` or `kafka` stream (see the module docstring)."""

    def __init__(self, spark: SparkSession, layout: StreamLayout, work_dir: Path) -> None:
        self._spark = spark
        self._layout = layout
        self._kafka = layout.kafka
        self._lanes: dict[int, _Lane] = {}
        self._kinds: dict[tuple[object, ...], int] = {}
        self.starts: list[int] = []  # the last batch's segments (the runtime's figures)
        self.malformed = 0  # `$punctuation` records that could not be read (and records gone)
        self.tuples = 0  # the last batch's tuples (its records less its punctuation records)
        self._warned = False
        self._file_discarded = 0
        self._offsets: Any = None
        self._log: Path | None = None
        if self._kafka:
            from pep.runtime.sources.frames import kafka_options
            servers, topic, _ = kafka_options(layout.definition)
            # the stream, its brokers and topic: a stream registered again on another topic
            # does not read this one's punctuations
            tag = hashlib.sha256(f"{servers}\n{topic}".encode()).hexdigest()[:16]
            self._log = Path(work_dir) / LOG_DIR / f"{layout.name}-{tag}.jsonl"
            self._load()

    def redefine(self, layout: StreamLayout) -> None:
        self._layout = layout

    @property
    def discarded(self) -> int:
        """Punctuations that came after a newer policy of their lane (out of order)."""
        return self._file_discarded + sum(lane.segments()[2] for lane in self._lanes.values())

    def moved(self, low: int | None) -> None:
        """(`BatchShield`'s call after routing: a batch's segments are made for it alone.)"""

    # ----- a batch ----------------------------------------------------------------------------
    def shielded(self, batch: DataFrame) -> tuple[DataFrame, BatchShield]:
        """The batch every job reads (no punctuation record in it; a file's tuples placed in
        their lanes) and its shield."""
        seq, punct = F.col(SEQ_COLUMN), F.col(PUNCT_COLUMN)
        lane = F.shiftright(seq, LANE_BITS) if self._kafka else F.col(FILE_COLUMN)
        rows = batch.groupBy(lane.alias("lane")).agg(
            F.min(seq).alias("lo"), F.max(seq).alias("hi"),
            F.count(F.when(punct.isNull(), 1)).alias("tuples"),
            F.collect_list(F.when(punct.isNotNull(), F.struct(seq.alias("at"),
                                                              punct.alias("sp")))).alias("sps")
        ).collect()
        self.tuples = sum(int(r["tuples"]) for r in rows)
        tuples = batch.where(punct.isNull()).drop(PUNCT_COLUMN)
        if self._kafka:
            lanes = self._kafka_lanes(rows)
        else:
            lanes, place = self._file_lanes(rows)
            if place is not None:
                tuples = tuples.withColumn(SEQ_COLUMN, place)
        return tuples, self._batch(tuples, lanes)

    def _kafka_lanes(self, rows: list[Any]
                     ) -> list[tuple[int, list[int], list[SegmentPolicy], int, int]]:
        """Each partition of the batch: its punctuations learnt (and logged) first."""
        out = []
        written: list[str] = []
        for row in sorted((r for r in rows if r["lane"] is not None),
                          key=lambda r: int(r["lane"])):
            p = int(row["lane"])
            base = p << LANE_BITS
            lo, hi = int(row["lo"]) - base, int(row["hi"]) - base
            lane = self._lanes.setdefault(p, _Lane())
            learnt: dict[int, Punctuation | None] = {}
            if lo > lane.seen + 1:  # records before the batch the log never read
                learnt.update(self._scan(p, lane.seen + 1, lo))
            for item in row["sps"]:
                learnt[int(item["at"]) - base] = self._read(item["sp"], f"partition {p} "
                                                            f"offset {int(item['at']) - base}")
            new = {o: sp for o, sp in learnt.items() if o not in lane.entries}
            if new:
                lane.entries.update(new)
                lane.cached = None
                written += [json.dumps({"p": p, "o": o, "sp": None if sp is None
                                        else sp.to_json()}, sort_keys=True)
                            for o, sp in sorted(new.items())]
            lane.seen = max(lane.seen, hi)
            if lane.seen > lane.logged and (new or lane.seen - lane.logged >= SEEN_EVERY):
                written.append(self._seen_line(p, lane))
            starts, policies, _ = lane.segments()
            out.append((p, starts, policies, lo, hi))
        if written:
            self._append(written)
        return out

    def _file_lanes(self, rows: list[Any]
                    ) -> tuple[list[tuple[int, list[int], list[SegmentPolicy], int, int]],
                               Any]:
        """Each file of the batch, numbered by its path in sorted order (the same on a batch
        run again: Spark's checkpoint names its files), with its segments."""
        files = sorted((r for r in rows if r["lane"] is not None), key=lambda r: str(r["lane"]))
        out = []
        for i, row in enumerate(files):
            entries = [(int(item["at"]), self._read(item["sp"], f"file {row['lane']} line "
                                                    f"{int(item['at']) + 1}"))
                       for item in row["sps"]]
            state = ShieldState()
            starts, policies = lane_segments(sorted(entries, key=lambda e: e[0]), state)
            self._file_discarded += state.discarded
            out.append((i, starts, policies, int(row["lo"]), int(row["hi"])))
        if not files:
            return out, None
        number = F.create_map(*[c for i, row in enumerate(files)
                                for c in (F.lit(str(row["lane"])), F.lit(i))])
        place = (F.shiftleft(F.element_at(number, F.col(FILE_COLUMN)).cast("long"), LANE_BITS)
                 + F.col(SEQ_COLUMN))
        return out, place

    def _batch(self, tuples: DataFrame,
               lanes: list[tuple[int, list[int], list[SegmentPolicy], int, int]]
               ) -> BatchShield:
        """The batch's segments on the one axis, and its tuple predicates matched in Spark."""
        starts: list[int] = []
        policies: list[SegmentPolicy] = []

        def put(at: int, policy: SegmentPolicy) -> None:
            if starts and starts[-1] == at:
                policies[-1] = policy
            else:
                starts.append(at)
                policies.append(policy)
        for number, lane_starts, lane_policies, lo, hi in lanes:
            base = number << LANE_BITS
            first = int(np.searchsorted(lane_starts, lo, side="right")) - 1
            last = int(np.searchsorted(lane_starts, hi, side="right")) - 1
            put(base, lane_policies[first] if first >= 0 else SegmentPolicy())
            for k in range(max(first + 1, 0), last + 1):
                put(base + lane_starts[k], lane_policies[k])
            # past the lane (no tuple of the batch is): denied
            put((number + 1) << LANE_BITS, SegmentPolicy(complete=False))
        self.starts = starts
        kinds = [self._kinds.setdefault(verdict_key(p), len(self._kinds)) for p in policies]
        wanted: dict[Conditions, list[tuple[int, int]]] = {}
        for i, policy in enumerate(policies):
            hi = starts[i + 1] if i + 1 < len(starts) else -1
            for conds in policy.conditions:
                wanted.setdefault(conds, []).append((starts[i], hi))
        index = {c: j for j, c in enumerate(wanted)}
        matches = match_tuples(tuples, wanted, index) if wanted else {}
        # `pruned`: a tuple before every segment (in no lane of the batch) is denied
        return BatchShield(self, np.asarray(starts, dtype=np.int64),
                           np.asarray(kinds, dtype=np.int64), policies, True, 0, index,
                           matches)

    # ----- punctuation records ----------------------------------------------------------------
    def _read(self, text: str, where: str) -> Punctuation | None:
        """A `$punctuation` record's value (JSON text; "" for a record that is not one), or
        None when it cannot be read (counted; logged once, without its content)."""
        try:
            return parse_punctuation(json.loads(text) if text else None, self._layout.schema)
        except (ValueError, TypeError, RecursionError, PunctuationError):
            self._doubt(where, "a $punctuation record that cannot be read")
            return None

    def _doubt(self, where: str, what: str) -> None:
        self.malformed += 1
        if not self._warned:
            self._warned = True
            log.warning("stream %s: %s at %s: its tuples after it reach nobody until a "
                        "punctuation starts a newer policy (further ones are only counted)",
                        self._layout.name, what, where)

    def _scan(self, partition: int, start: int, end: int) -> dict[int, Punctuation | None]:
        """The punctuations of a partition's offsets [start, end), which no batch of this
        log read: one bounded Kafka read in Spark, only punctuation records collected."""
        from pep.runtime.sources.frames import kafka_options, kafka_range_frame
        from pep.runtime.sources.kafka_offsets import KafkaOffsets
        from pep.runtime.sources.replay import offsets_json
        definition = self._layout.definition
        topic = kafka_options(definition)[1]
        where = f"partition {partition} offsets {start}-{end - 1}"
        try:
            if self._offsets is None:
                self._offsets = KafkaOffsets()
            held = self._offsets.start_offsets(definition)
            if partition >= len(held) or held[partition] > start:
                self._doubt(where, "records the topic no longer holds (maybe punctuations)")
                return {start: None}
            frame = kafka_range_frame(self._spark, definition,
                                      json.dumps({topic: [partition]}),
                                      offsets_json(topic, {partition: start}),
                                      offsets_json(topic, {partition: end}))
            found = (frame.where(F.col(PUNCT_COLUMN).isNotNull())
                     .select(SEQ_COLUMN, PUNCT_COLUMN).collect())
        except Exception as exc:  # noqa: BLE001 - unread records are in doubt, never skipped
            self._doubt(where, f"records that could not be read ({type(exc).__name__})")
            return {start: None}
        base = partition << LANE_BITS
        return {int(r[SEQ_COLUMN]) - base: self._read(r[PUNCT_COLUMN], f"partition "
                                                      f"{partition} offset "
                                                      f"{int(r[SEQ_COLUMN]) - base}")
                for r in found}

    # ----- the log ----------------------------------------------------------------------------
    def _load(self) -> None:
        """The Kafka stream's log as a previous run left it (whole lines only)."""
        assert self._log is not None
        try:
            data = self._log.read_bytes()
        except FileNotFoundError:
            return
        types = self._layout.types
        from pep.core.punctuations import punctuation_from_json
        for line in data[:data.rfind(b"\n") + 1].decode("utf-8").splitlines():
            if not line.strip():
                continue
            doc = json.loads(line)
            lane = self._lanes.setdefault(int(doc["p"]), _Lane())
            if "seen" in doc:
                lane.seen = lane.logged = max(lane.seen, int(doc["seen"]))
            else:
                sp = doc["sp"]
                lane.entries[int(doc["o"])] = (None if sp is None
                                               else punctuation_from_json(sp, types))

    def _append(self, lines: list[str]) -> None:
        """Appended and fsynced before the batch is routed: a crash after it leaves the log
        at least as far as the batches Spark committed."""
        assert self._log is not None
        self._log.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())

    @staticmethod
    def _seen_line(p: int, lane: _Lane) -> str:
        lane.logged = lane.seen
        return json.dumps({"p": p, "seen": lane.seen}, sort_keys=True)

    def close(self) -> None:
        """The query stopped: the offsets read are logged (a crash before loses only them:
        the next start reads those records again for punctuations)."""
        if self._log is not None:
            lines = [self._seen_line(p, lane) for p, lane in sorted(self._lanes.items())
                     if lane.seen > lane.logged]
            if lines:
                self._append(lines)
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None


__all__ = ["SourceShield", "LOG_DIR"]
