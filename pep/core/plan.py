"""The execution plan: what the PEP hands to the stream runtime, and the stream schema both use.

The PEP core (conditions, obligations, user queries, merge, analysis) ends in an `ExecutionPlan`;
the Spark runtime (`pep.runtime`) starts from one. Keeping this boundary small and data-only lets
the heart of the gateway stay pure Python, and lets the runtime treat conditions as data (attribute,
operator code, constant) rather than as SQL text, which closes the door on injection.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Literal, overload

from pep.core.jsontypes import JsonObject
from pep.core.labels import Label, Lattice
from pep.core.privacy import PrivacyAsk, PrivacySpec, spec_from_json

FieldType = Literal["double", "long", "string", "boolean", "timestamp", "label"]
Scalar = float | int | str | bool
Operator = Literal["<", "<=", ">", ">=", "=", "!="]
# The negations of label comparisons (`pep.core.labels`: NOT pushed into a comparison on a label
# attribute is no comparison of the six), which a plan's predicates may hold too.
LabelOperator = Literal["!<=", "!>=", "!<", "!>"]
PredicateOperator = Operator | LabelOperator
AggregateFunction = Literal["avg", "max", "min", "sum", "count", "firstval", "lastval", "lub"]

OPERATORS: tuple[Operator, ...] = ("<", "<=", ">", ">=", "=", "!=")
AGGREGATE_FUNCTIONS: tuple[AggregateFunction, ...] = (
    "avg", "max", "min", "sum", "count", "firstval", "lastval",
    "lub")  # lub: a label attribute's least upper bound


class _Keyed:
    """A frozen plan's canonical text and key, computed once: planning a request asks for its
    key three times, and a revocation pass asks again for every live handle (the canonical
    form walks the whole plan through `dataclasses.asdict`, about 0.2 ms). They are kept in the
    instance's own `__dict__`, outside the dataclass fields: equality, hashing and `asdict` do
    not see them. Identical plans have the same key: they are computed once and share their
    handles."""

    def _canonical_json(self) -> str:
        raise NotImplementedError

    def canonical_json(self) -> str:
        cache = self.__dict__
        text: str | None = cache.get("_canonical")
        if text is None:
            text = cache["_canonical"] = self._canonical_json()
        return text

    def key(self) -> str:
        cache = self.__dict__
        key: str | None = cache.get("_key")
        if key is None:
            key = cache["_key"] = hashlib.sha256(self.canonical_json().encode()).hexdigest()
        return key


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    # A `label` attribute's levels and categories (`pep.core.labels`); None for other types.
    lattice: Lattice | None = None


@dataclass(frozen=True)
class StreamSchema:
    """Ordered attributes of a stream. Attribute names are matched case-insensitively."""

    fields: tuple[Field, ...]

    def lookup(self, name: str) -> Field | None:
        low = name.lower()
        for f in self.fields:
            if f.name.lower() == low:
                return f
        return None

    def field(self, name: str) -> Field:
        """The attribute `name` names, where it is known to be in the schema (a name already
        checked, or one read from the schema): KeyError otherwise."""
        found = self.lookup(name)
        if found is None:
            raise KeyError(name)
        return found

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)


@dataclass(frozen=True)
class Predicate:
    """`attribute op value`; a predicate over a missing (null) attribute is false.

    `mask` (a mask's spec, `pep.core.masks`): the comparison is on the attribute's masked
    value (a consumer's filter on a masked attribute), not on the raw value."""

    attribute: str  # canonical schema name
    op: PredicateOperator  # a label operator only on a label attribute
    value: Scalar | Label  # a label attribute's constant: its `Label` (its text, read back)
    mask: str | None = None


@dataclass(frozen=True)
class SpatialPredicate:
    """A spatial test over two coordinate attributes (`pep.core.conditions`, `pep.core.geo`).

    function "distance": the haversine distance in metres from (latitude, longitude) to the point
    `points` = (lat, lon) compared with `value` by `op`; "distance_to": the same to the latest
    position of the anchor (the tuple whose `key` equals `key_value`), strictly before this tuple
    in stream order; "polygon": `op` "=" inside the polygon `points` (lat1, lon1, ...), "!="
    outside, `value` 0. False on a tuple without a valid position, and (distance_to) while no
    position of the anchor is known, whatever the op."""

    function: Literal["distance", "distance_to", "polygon"]
    latitude: str
    longitude: str
    op: Operator
    value: float
    points: tuple[float, ...] = ()
    key: str | None = None
    key_value: Scalar | Label | None = None  # a value of `key`, bound as a comparison's constant

    @property
    def attributes(self) -> tuple[str, ...]:
        return (self.latitude, self.longitude) + ((self.key,) if self.key else ())


AnyPredicate = Predicate | SpatialPredicate
Conjunct = tuple[AnyPredicate, ...]


@dataclass(frozen=True)
class Aggregate:
    attribute: str
    function: AggregateFunction

    @property
    def output_name(self) -> str:
        return f"{self.function}_{self.attribute}"


@dataclass(frozen=True)
class WindowSpec:
    """A window: the one value for a plan's, a policy's and a consumer's (what only a policy or
    only a consumer says of its window is held apart: `PolicyWindowTerms`, `WindowAsk`).

    Tuple windows count rows (size/step in tuples); time windows use seconds of event time.
    `min_count`: a window that holds fewer tuples is not emitted (a window of one tuple shows it
    raw). `keys`: attributes the aggregates are grouped by within each window (one output row per
    key value per window; the key values are part of the row). `privacy`: the window is
    released with noise (differential privacy, `pep.core.privacy`); None: exact.

    In a policy's graph, `keys` are the group-by attributes it allows (the finest grouping),
    `min_count` the fewest tuples a window may hold, and `time_attribute` is None (the stream
    gives it when planning). In a consumer's, `aggregates` empty means "whatever the policy
    allows", `min_count` 1 "the policy's", and `keys` and `privacy` are left empty: what it asks
    of them is its `WindowAsk`."""

    kind: Literal["tuple", "time"]
    size: int
    step: int
    aggregates: tuple[Aggregate, ...]
    time_attribute: str | None = None  # event-time attribute for time windows
    min_count: int = 1
    keys: tuple[str, ...] = ()
    privacy: PrivacySpec | None = None
    # (label attribute, label text): a window is delivered only when the least upper bound of
    # its tuples' labels is dominated by the label (MLS: a reader's session level). Only a
    # policy whose owner chose the label scope `all` gives these; by default a label bound is
    # a filter before the window (pep.core.obligations)
    label_bounds: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PolicyWindowTerms:
    """What only a policy says of its window: the attributes a consumer may filter on before it
    (none by default: a filter there would choose which tuples a window aggregates)."""

    prefilter: tuple[str, ...] = ()


@dataclass(frozen=True)
class WindowAsk:
    """What only a consumer's query says of its window: the group-by keys it asks for (None: the
    policy's), whether a window finer than the policy's is raised to it (ASSIST Definition 4)
    rather than refused, and the smaller epsilon or delta it asks of a private window."""

    keys: tuple[str, ...] | None = None
    coarsen: bool = False
    privacy: PrivacyAsk | None = None


@dataclass(frozen=True)
class ExecutionPlan(_Keyed):
    """One consumer's authorised view of one stream.

    filter_dnf: None means every tuple passes; otherwise a tuple passes when all predicates of at
    least one conjunct hold (an empty tuple of conjuncts therefore passes nothing).
    The filter is always applied before the projection and the window.
    """

    stream: str
    filter_dnf: tuple[Conjunct, ...] | None
    projection: tuple[str, ...]
    window: WindowSpec | None = None
    # Tuples at or before this stream position (`_xsg_seq`) are never given to the plan: a
    # consumer's query never aggregates tuples an earlier query of theirs aggregated differently.
    start_after: int | None = None
    # (attribute, mask spec) of the attributes the plan outputs masked (pep.core.masks), in
    # schema order: applied right after the filter, before the projection and the window.
    masks: tuple[tuple[str, str], ...] = ()
    # A Kafka stream's records have no stream position: its cut is per partition. Element p is
    # the first offset of partition p given to the plan (the partition's end offset when the
    # handle was requested); a partition beyond the tuple (added later) gives every record.
    start_offsets: tuple[int, ...] | None = None
    # On a stream with security punctuations (`pep.core.punctuations`): the consumer's roles,
    # which the punctuations' SRPs are read against, and whether the grant defers to them
    # (the `stream-punctuations-defer` obligation); None: the stream has none.
    punctuation_roles: tuple[str, ...] | None = None
    punctuation_defer: bool = False

    def _canonical_json(self) -> str:
        doc = asdict(self)
        # Fields added after plans were first persisted are left out at their defaults, so a
        # stored plan's key does not change with the version that reads it.
        for name, default in _LATER_FIELDS.items():
            if doc.get(name) == default:
                doc.pop(name, None)
        if not doc.get("masks"):
            doc.pop("masks", None)
        for conj in doc.get("filter_dnf") or ():
            for p in conj:
                if "mask" in p and p["mask"] is None:
                    del p["mask"]
        if doc.get("window"):
            for name, default in _LATER_WINDOW_FIELDS.items():
                if doc["window"].get(name) == default:
                    doc["window"].pop(name, None)
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)


_LATER_FIELDS: dict[str, object] = {"start_after": None, "start_offsets": None,
                                     "punctuation_roles": None, "punctuation_defer": False}
_LATER_WINDOW_FIELDS = {"min_count": 1, "keys": (), "privacy": None, "label_bounds": ()}


def plan_from_json(data: str | JsonObject) -> ExecutionPlan:
    """Rebuild an ExecutionPlan from its canonical JSON (to re-attach a handle after a restart)."""
    d = json.loads(data) if isinstance(data, str) else data
    dnf = d.get("filter_dnf")
    window = d.get("window")
    return ExecutionPlan(
        stream=d["stream"],
        filter_dnf=None if dnf is None else tuple(
            tuple(_predicate_from_json(p) for p in conj) for conj in dnf),
        projection=tuple(d.get("projection") or ()),
        window=None if window is None else WindowSpec(
            kind=window["kind"], size=int(window["size"]), step=int(window["step"]),
            aggregates=tuple(Aggregate(a["attribute"], a["function"])
                             for a in window.get("aggregates") or ()),
            time_attribute=window.get("time_attribute"),
            min_count=int(window.get("min_count", 1)),
            keys=tuple(window.get("keys") or ()),
            privacy=spec_from_json(window.get("privacy")),
            label_bounds=tuple((str(a), str(b)) for a, b in window.get("label_bounds") or ())),
        start_after=None if d.get("start_after") is None else int(d["start_after"]),
        masks=tuple((str(a), str(m)) for a, m in d.get("masks") or ()),
        start_offsets=None if d.get("start_offsets") is None else
        tuple(int(o) for o in d["start_offsets"]),
        punctuation_roles=None if d.get("punctuation_roles") is None else
        tuple(str(r) for r in d["punctuation_roles"]),
        punctuation_defer=bool(d.get("punctuation_defer", False)))


def _predicate_from_json(p: JsonObject) -> AnyPredicate:
    if "function" in p:
        return SpatialPredicate(p["function"], p["latitude"], p["longitude"], p["op"],
                                float(p["value"]), tuple(float(v) for v in p.get("points") or ()),
                                p.get("key"), p.get("key_value"))
    return Predicate(p["attribute"], p["op"], p["value"], p.get("mask"))


@dataclass(frozen=True)
class JoinPlan(_Keyed):
    """A windowed join of two authorised views: what a join's handle runs.

    Each side is an `ExecutionPlan`, merged from that stream's obligations and its part of the
    user query exactly as a single-stream request is, so each side is enforced before the join.
    A left row and a right row meet when, for every pair in `on`, the left side's output
    attribute equals the right side's, and their times are at most `within` seconds apart. A
    side's time is its stream's event-time attribute for a plain side (`left_time` names it, and
    it is one of the side's outputs), or `window_end` for a time-windowed side (which joins on
    its window outputs, never on raw tuples). A result row holds both sides' outputs, each named
    `<stream>.<output>` (`weather.rainrate`, `ais.mmsi`)."""

    left: ExecutionPlan
    right: ExecutionPlan
    on: tuple[tuple[str, str], ...]  # (left output, right output) pairs, all must be equal
    within: float  # seconds
    left_time: str  # the time attribute of a plain side, "window_end" of a windowed one
    right_time: str
    # MLS: (left output, right output), the two sides' labels over one lattice; each result
    # row then also carries `label`, their least upper bound (pep.core.join.joined_label)
    label: tuple[str, str] | None = None

    @property
    def stream(self) -> str:
        """The first (requested) stream: where the handle is listed."""
        return self.left.stream

    @property
    def streams(self) -> tuple[str, str]:
        return (self.left.stream, self.right.stream)

    def output_name(self, side: Literal["left", "right"], name: str) -> str:
        plan = self.left if side == "left" else self.right
        return f"{plan.stream}.{name}"

    def _canonical_json(self) -> str:
        doc = {"join": {"left": json.loads(self.left.canonical_json()),
                        "right": json.loads(self.right.canonical_json()),
                        "on": [list(pair) for pair in self.on], "within": float(self.within),
                        "left_time": self.left_time, "right_time": self.right_time}}
        if self.label is not None:  # only then: the keys of unlabelled joins are unchanged
            doc["join"]["label"] = list(self.label)
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class UnionPlan(_Keyed):
    """The union of several grants on one stream (ASSIST's Secure Read, Definitions 2 and 4):
    what a consumer gets when the stream's obligations combine by `union` and more than one
    rule's grant applies. Each member is one grant's view merged with the consumer's query, as
    a single-stream request's plan. A tuple that passes some plain member is delivered once,
    with the attributes of every plain member it passes (schema order); each windowed member
    computes its own windows, whose rows carry `grant`: the member's index in `plans`."""

    stream: str
    plans: tuple[ExecutionPlan, ...]

    @property
    def start_after(self) -> int | None:
        marks = [p.start_after for p in self.plans if p.start_after is not None]
        return max(marks) if marks else None

    def with_start_after(self, position: int) -> UnionPlan:
        from dataclasses import replace
        return UnionPlan(self.stream, tuple(
            replace(p, start_after=max(position, p.start_after or 0)) for p in self.plans))

    @property
    def start_offsets(self) -> tuple[int, ...] | None:
        """The members' Kafka cut (they are cut together: the same one)."""
        cuts = [p.start_offsets for p in self.plans if p.start_offsets is not None]
        return cuts[0] if cuts else None

    def _canonical_json(self) -> str:
        doc = {"union": {"stream": self.stream,
                         "plans": [json.loads(p.canonical_json()) for p in self.plans]}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)


AnyPlan = ExecutionPlan | JoinPlan | UnionPlan


def is_join_json(data: str | JsonObject) -> bool:
    """Whether a stored plan (canonical JSON or its dict) is a join's."""
    if isinstance(data, str):
        return data.startswith('{"join":')
    return "join" in data


def any_plan_from_json(data: str | JsonObject) -> AnyPlan:
    """A stored plan of any kind: a single stream's `ExecutionPlan`, a `JoinPlan` or a
    `UnionPlan`."""
    d = json.loads(data) if isinstance(data, str) else data
    if "union" in d:
        u = d["union"]
        return UnionPlan(str(u["stream"]), tuple(plan_from_json(p) for p in u["plans"]))
    if "join" not in d:
        return plan_from_json(d)
    j = d["join"]
    return JoinPlan(left=plan_from_json(j["left"]), right=plan_from_json(j["right"]),
                    on=tuple((str(a), str(b)) for a, b in j["on"]),
                    within=float(j["within"]), left_time=j["left_time"],
                    right_time=j["right_time"],
                    label=None if j.get("label") is None else
                    (str(j["label"][0]), str(j["label"][1])))


def plan_streams(plan: AnyPlan) -> tuple[str, ...]:
    """The streams a plan reads: one, or a join's two."""
    return plan.streams if isinstance(plan, JoinPlan) else (plan.stream,)


def side_plans(plan: AnyPlan) -> dict[str, ExecutionPlan | UnionPlan]:
    """Each stream's own authorised view in a plan: {stream: plan} (a union is one view)."""
    if isinstance(plan, JoinPlan):
        return {plan.left.stream: plan.left, plan.right.stream: plan.right}
    return {plan.stream: plan}


@overload
def with_start_offsets(plan: ExecutionPlan, offsets: tuple[int, ...]) -> ExecutionPlan: ...


@overload
def with_start_offsets(plan: UnionPlan, offsets: tuple[int, ...]) -> UnionPlan: ...


@overload
def with_start_offsets(plan: ExecutionPlan | UnionPlan, offsets: tuple[int, ...]
                       ) -> ExecutionPlan | UnionPlan: ...


def with_start_offsets(plan: ExecutionPlan | UnionPlan, offsets: tuple[int, ...]
                       ) -> ExecutionPlan | UnionPlan:
    """A Kafka stream's view cut at `offsets` (per partition: the first offset it is given),
    every member of a union alike. A plan cut already keeps, per partition, the later cut."""
    from dataclasses import replace

    def cut(p: ExecutionPlan) -> ExecutionPlan:
        old = p.start_offsets or ()
        width = max(len(old), len(offsets))
        merged = tuple(max(old[i] if i < len(old) else 0, offsets[i] if i < len(offsets) else 0)
                       for i in range(width))
        return replace(p, start_offsets=merged)
    if isinstance(plan, UnionPlan):
        return UnionPlan(plan.stream, tuple(cut(p) for p in plan.plans))
    return cut(plan)


def replayable(plan: AnyPlan) -> bool:
    """A Kafka view whose rows each micro-batch's records alone determine, so that a restart
    can compute them again, with the same order and the same ids (`pep/runtime/sources/replay.py`):
    cut at offsets (so that it never gets records from before its request), no window (a
    window's open state lives in the process), no `distance_to` (its anchor is the latest
    position seen so far); a union when every member is. Never a join (its pairs and windows
    live in the process)."""
    if isinstance(plan, JoinPlan):
        return False
    members = plan.plans if isinstance(plan, UnionPlan) else (plan,)
    return bool(members) and all(
        p.start_offsets is not None and p.window is None
        and not any(isinstance(q, SpatialPredicate) and q.function == "distance_to"
                    for conj in p.filter_dnf or () for q in conj)
        for p in members)


def member_plans(plan: ExecutionPlan | UnionPlan) -> tuple[ExecutionPlan, ...]:
    """A single stream's plan as its members: a union's, or the plan itself."""
    return plan.plans if isinstance(plan, UnionPlan) else (plan,)


SourceKind = Literal["ingest", "files", "generator", "socket", "kafka"]


@dataclass(frozen=True)
class SourceSpec:
    """Where a stream's tuples come from.

    ingest: a directory the gateway owns; `POST /streams/<name>/records` writes JSON-lines files
      into it atomically (options: {"path": dir}).
    files: an existing directory of JSON lines / CSV / Parquet files
      (options: {"path": dir, "format": "json"|"csv"|"parquet"}).
    generator: built-in synthetic source (options: {"schema": "weather"|"ais", "rate": rows/s}).
    socket: text lines of JSON from host:port, for tests (options: {"host", "port"}).
    kafka: configuration only (options: {"bootstrap.servers", "subscribe"}); needs the connector.
    """

    kind: SourceKind
    options: tuple[tuple[str, str], ...] = ()

    def option(self, name: str, default: str | None = None) -> str | None:
        return dict(self.options).get(name, default)


@dataclass(frozen=True)
class StreamDefinition:
    name: str
    owner: str  # the authenticated subject that registered it
    schema: StreamSchema
    source: SourceSpec
    # Event-time attribute (a timestamp or epoch-seconds number) used by time windows and, with
    # arrival sequence, to order tuples for tuple windows.
    time_attribute: str | None = None
    # Seconds the time windows of this stream wait for late tuples (the watermark is the largest
    # event time seen minus this); None: the runtime's default. The owner may change it.
    lateness: float | None = None
