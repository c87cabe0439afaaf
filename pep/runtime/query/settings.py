"""What several parts of a stream's shared query read and none of them changes: the settings it
is built with (`QuerySettings`) and the stream as the parts see it (`StreamLayout`, replaced
whole when the stream's definition changes)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from pyspark.sql import SparkSession

from pep.core.plan import StreamDefinition, StreamSchema
from pep.runtime.base.columns import HASHED_PREFIX
from pep.runtime.plans.compile import CompiledPlan
from pep.runtime.sources.frames import KAFKA_MAX_OFFSETS

# Tuple windows with panes narrower than this travel as rows (see README "Where windows are
# computed"); wider panes are aggregated in Spark.
DEFAULT_TUPLE_PANE_MIN = 8
# sources whose every tuple has `_xsg_seq`; a Kafka record has none, and is ordered by the
# stream's time attribute, then partition, then offset (`_xsg_file`, see sources/frames.py)
SEQ_KINDS = ("ingest", "generator")
UNIQUE_SEQ_KINDS = ("ingest", "generator")  # ... and no two tuples share one
MAX_LONG = (1 << 63) - 1
TIME_LIMIT = float(1 << 53)  # seconds: larger numeric event times (and NaN) are no time


@dataclass(frozen=True)
class QuerySettings:
    """The settings a stream's query is made with, the same for its whole life."""

    spark: SparkSession
    work_dir: Path
    trigger_interval: float
    max_files_per_trigger: int
    tuple_pane_min: int = DEFAULT_TUPLE_PANE_MIN
    # the stream owner's key of hash masks (`pep.runtime.privacy.mask_keys`); None: none served
    mask_key: Callable[[str], bytes] | None = None
    # a Kafka stream's records per micro-batch (`sources/frames.py`: larger through plan topics)
    max_offsets_per_trigger: int = KAFKA_MAX_OFFSETS


@dataclass(frozen=True, eq=False)
class StreamLayout:
    """The stream as the query's parts read it: its definition, its attributes' names, 1-based
    indices (the plan table's and the value arrays' numbering) and types, and how its tuples
    are ordered. Made once per definition (`of`); a changed definition gives a new layout,
    handed to every part that reads it (`StreamExecutor`)."""

    definition: StreamDefinition
    field_names: tuple[str, ...]
    index: Mapping[str, int]
    types: Mapping[str, str]
    # the source may lack `_xsg_seq`: tuples are ordered by time, file and position too
    full_order: bool
    # the attribute whose time orders tuples on such sources (a timestamp or a number)
    time_attr: str | None

    @staticmethod
    def of(definition: StreamDefinition) -> StreamLayout:
        names = tuple(definition.schema.names)
        return StreamLayout(definition, names,
                            MappingProxyType({n: i + 1 for i, n in enumerate(names)}),
                            MappingProxyType({f.name: f.type for f in definition.schema.fields}),
                            definition.source.kind not in SEQ_KINDS,
                            _order_time_attribute(definition))

    @property
    def schema(self) -> StreamSchema:
        return self.definition.schema

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def kafka(self) -> bool:
        """A Kafka stream: no stream positions; deliveries carry their micro-batch, and the rows
        read come from Spark's progress reports."""
        return self.definition.source.kind == "kafka"

    def row_columns(self, compiled: CompiledPlan, names: Iterable[str]) -> list[str]:
        """The rows job's columns holding a plan's values of `names` (a hashed long: its
        text's column)."""
        hashed = {self.field_names[i - 1] for i, m in compiled.masks if m.kind == "hash"
                  and self.types[self.field_names[i - 1]] == "long"}
        return [HASHED_PREFIX + n if n in hashed else n for n in names]


def _order_time_attribute(definition: StreamDefinition) -> str | None:
    attr = definition.time_attribute
    if not attr:
        return None
    f = definition.schema.lookup(attr)
    if f is None or f.type not in ("timestamp", "double", "long"):
        return None
    return f.name


__all__ = ["QuerySettings", "StreamLayout", "DEFAULT_TUPLE_PANE_MIN", "SEQ_KINDS",
           "UNIQUE_SEQ_KINDS", "MAX_LONG", "TIME_LIMIT"]
