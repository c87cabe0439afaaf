"""Security punctuations: access-control predicates a data provider embeds in its stream
(Nehme, Rundensteiner and Bertino, "A Security Punctuation Framework for Enforcing Access
Control on Streaming Data", sections 4 and 5). Pure Python: the record form, its checks, the
Security Shield's state (`ShieldState`, the paper's Fig. 10) and the verdict a segment's policy
gives a consumer's roles, per attribute (`visible_attributes`). The runtime
(`pep/runtime/query/shield.py`) applies them per tuple in Spark's results; the tests' oracle
(`oracle`) applies them to plain records, the same functions.

A punctuation (`Punctuation`) is `<DDP | SRP | sign | immutable | ts | sn>`:
- DDP: which tuples (`where`: a conjunction of comparisons, None: every tuple of the stream)
  and which of their attributes (`attributes`, None: all of them);
- SRP: the roles it names (RBAC, as in the paper);
- sign: `+` (only these roles may see the objects) or `-` (these roles may not);
- immutable: it stays in force after later policies replace the current one (later
  punctuations can only narrow it, never lift it);
- ts, sn: the policy's timestamp and the punctuation's number in it (1, 2, ...).

Semantics (`docs/punctuations.md` says where they depart from the paper):
- consecutive punctuations with one `ts` form one policy; a newer `ts` replaces the current
  policy; an older one is discarded (out of order, counted);
- a policy whose numbers are not exactly 1..n is incomplete: its tuples reach nobody
  (denial by default);
- within the current policy, positive punctuations covering an object combine by union (any of
  them names one of the consumer's roles), negative ones deny; each immutable punctuation seen
  so far is a further restriction (intersection);
- `refine` (the default): an object no positive punctuation covers is left to the XACML policy,
  which has already narrowed the consumer's plan: a punctuation only narrows;
- `defer` (the owner's policy carries the `stream-punctuations-defer` obligation): an object is
  visible only where a positive punctuation names one of the consumer's roles (no policy yet,
  no access), so the punctuations decide within what the permit's plan allows.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pep.core.errors import InvalidInput, Unprocessable
from pep.core.plan import (
    AnyPlan,
    ExecutionPlan,
    JoinPlan,
    SpatialPredicate,
    StreamDefinition,
    StreamSchema,
    UnionPlan,
)

PUNCTUATION_KEY = "$punctuation"  # a record carrying a punctuation: {"$punctuation": {...}}
SOURCE_OPTION = "punctuations"  # the stream setting (a source option): "on" enables them
POSITIVE, NEGATIVE = "+", "-"
OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
ORDERED_TYPES = ("double", "long", "timestamp")
MAX_ROLES = 64
MAX_CONDITIONS = 16
MAX_TS = 1 << 62
Value = str | int | float | bool


class PunctuationError(InvalidInput):
    """A punctuation record that cannot be read; the message says what and where."""


@dataclass(frozen=True)
class Condition:
    """`attribute op value`, a tuple DDP's comparison (a null value never satisfies it)."""

    attribute: str
    op: str
    value: Value
    type: str  # the attribute's type: how the value compares

    def holds(self, value: Any) -> bool:
        if value is None:
            return False
        left, right = _comparable(value, self.type), _comparable(self.value, self.type)
        if self.op == "=":
            return bool(left == right)
        if self.op == "!=":
            return bool(left != right)
        if self.op == "<":
            return bool(left < right)
        if self.op == "<=":
            return bool(left <= right)
        if self.op == ">":
            return bool(left > right)
        return bool(left >= right)


def _comparable(value: Any, ftype: str) -> Any:
    if ftype == "timestamp" and isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    if ftype in ("double", "long", "timestamp"):
        return float(value)
    return value


@dataclass(frozen=True)
class Punctuation:
    """One security punctuation (see the module docstring)."""

    roles: frozenset[str]
    sign: str = POSITIVE
    where: tuple[Condition, ...] | None = None  # None: every tuple
    attributes: tuple[str, ...] | None = None  # None: the whole tuple
    immutable: bool = False
    ts: int = 0
    sn: int = 1

    def covers(self, attribute: str, matched: bool) -> bool:
        """Whether it applies to `attribute` of a tuple (`matched`: the tuple meets `where`)."""
        if self.where is not None and not matched:
            return False
        return self.attributes is None or attribute in self.attributes

    def to_json(self) -> dict[str, Any]:
        ddp: dict[str, Any] = {
            "tuples": "all" if self.where is None else
            [{"attribute": c.attribute, "op": c.op, "value": c.value} for c in self.where],
            "attributes": "all" if self.attributes is None else list(self.attributes)}
        return {"ddp": ddp, "srp": sorted(self.roles), "sign": self.sign,
                "immutable": self.immutable, "ts": self.ts, "sn": self.sn}


def enabled(definition: StreamDefinition) -> bool:
    """Whether the stream's owner enabled punctuations (source option `punctuations=on`)."""
    return (definition.source.option(SOURCE_OPTION) or "").lower() == "on"


def parse_punctuation(doc: Any, schema: StreamSchema, where: str = "") -> Punctuation:
    """The punctuation of a record's `$punctuation` value; PunctuationError says what is wrong
    and where (`where` prefixes the message, e.g. "line 3")."""
    at = f"{where}: " if where else ""

    def fail(message: str) -> PunctuationError:
        return PunctuationError(f"{at}{PUNCTUATION_KEY}: {message}")

    if not isinstance(doc, Mapping):
        raise fail("must be a JSON object {ddp, srp, sign, immutable, ts, sn}")
    unknown = sorted(str(k)[:40] for k in doc if k not in ("ddp", "srp", "sign", "immutable",
                                                          "ts", "sn"))
    if unknown:
        raise fail(f"unknown field(s) {', '.join(unknown)} (known: ddp, srp, sign, immutable, "
                   "ts, sn)")
    roles = doc.get("srp")
    if (not isinstance(roles, list) or not roles or len(roles) > MAX_ROLES
            or not all(isinstance(r, str) and 0 < len(r) <= 256 for r in roles)):
        raise fail(f"srp must be a list of 1 to {MAX_ROLES} role names (non-empty strings)")
    sign = doc.get("sign", POSITIVE)
    if sign not in (POSITIVE, NEGATIVE):
        raise fail(f"sign must be {POSITIVE!r} or {NEGATIVE!r}")
    immutable = doc.get("immutable", False)
    if not isinstance(immutable, bool):
        raise fail("immutable must be true or false")
    ts, sn = doc.get("ts"), doc.get("sn", 1)
    for name, value, low in (("ts", ts, 0), ("sn", sn, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < MAX_TS:
            raise fail(f"{name} must be an integer from {low} (the policy's "
                       f"{'timestamp' if name == 'ts' else 'number of this punctuation'})")
    assert isinstance(ts, int) and isinstance(sn, int)
    ddp = doc.get("ddp", {})
    if not isinstance(ddp, Mapping) or any(k not in ("tuples", "attributes") for k in ddp):
        raise fail("ddp must be an object {tuples, attributes}")
    by_lower = {f.name.lower(): f for f in schema.fields}
    tuples = ddp.get("tuples", "all")
    conditions: tuple[Condition, ...] | None = None
    if tuples != "all":
        if not isinstance(tuples, list) or not 0 < len(tuples) <= MAX_CONDITIONS:
            raise fail(f"ddp.tuples must be \"all\" or a list of 1 to {MAX_CONDITIONS} "
                       "comparisons {attribute, op, value}")
        conditions = tuple(_condition(c, by_lower, fail, i + 1) for i, c in enumerate(tuples))
    attrs = ddp.get("attributes", "all")
    attributes: tuple[str, ...] | None = None
    if attrs != "all":
        if not isinstance(attrs, list) or not attrs:
            raise fail("ddp.attributes must be \"all\" or a non-empty list of attribute names")
        names = []
        for a in attrs:
            f = by_lower.get(a.lower()) if isinstance(a, str) else None
            if f is None:
                raise fail(f"ddp.attributes: {str(a)[:64]!r} is not an attribute of the stream")
            names.append(f.name)
        attributes = tuple(dict.fromkeys(names))
    return Punctuation(frozenset(roles), sign, conditions, attributes, immutable, ts, sn)


def _condition(doc: Any, by_lower: Mapping[str, Any], fail: Any, n: int) -> Condition:
    if not isinstance(doc, Mapping) or set(doc) != {"attribute", "op", "value"}:
        raise fail(f"ddp.tuples[{n}] must be an object {{attribute, op, value}}")
    f = by_lower.get(doc["attribute"].lower()) if isinstance(doc["attribute"], str) else None
    if f is None:
        raise fail(f"ddp.tuples[{n}]: {str(doc['attribute'])[:64]!r} is not an attribute of "
                   "the stream")
    op, value = doc["op"], doc["value"]
    if op not in OPERATORS:
        raise fail(f"ddp.tuples[{n}]: op must be one of {' '.join(OPERATORS)}")
    if op not in ("=", "!=") and f.type not in ORDERED_TYPES:
        raise fail(f"ddp.tuples[{n}]: {f.name} is a {f.type}: only = and != compare it")
    ok = {"double": (int, float), "long": (int,), "string": (str,), "label": (str,),
          "boolean": (bool,), "timestamp": (str,)}[f.type]
    if isinstance(value, bool) != (f.type == "boolean") or not isinstance(value, ok):
        raise fail(f"ddp.tuples[{n}]: value {str(value)[:40]!r} is not a {f.type}")
    if f.type == "timestamp":
        try:
            _comparable(value, "timestamp")
        except ValueError:
            raise fail(f"ddp.tuples[{n}]: value {str(value)[:40]!r} is not an ISO-8601 "
                       "timestamp") from None
    return Condition(f.name, op, value, f.type)


def punctuation_from_json(doc: Mapping[str, Any], types: Mapping[str, str]) -> Punctuation:
    """A punctuation as `Punctuation.to_json` wrote it (the stream's log, which only the
    ingest writes, after `parse_punctuation` checked it): read without checking it again
    (`types`: the stream's attribute types). A log that does not read so raises (KeyError,
    TypeError): the micro-batch fails rather than run without the punctuation."""
    ddp = doc["ddp"]
    tuples, attrs = ddp["tuples"], ddp["attributes"]
    where = None if tuples == "all" else tuple(
        Condition(c["attribute"], c["op"], c["value"], types[c["attribute"]]) for c in tuples)
    attributes = None if attrs == "all" else tuple(attrs)
    return Punctuation(frozenset(doc["srp"]), doc["sign"], where, attributes,
                       bool(doc["immutable"]), int(doc["ts"]), int(doc["sn"]))


def shielded_plan(plan: AnyPlan, definitions: Sequence[StreamDefinition],
                  roles: Iterable[str]) -> AnyPlan:
    """The plan a consumer's handle runs on punctuated streams: the plan carrying the
    consumer's roles, which the punctuations' SRPs are read against (a join: each side on a
    punctuated stream; a union of grants: each member); the plan as it is when no stream of it
    has punctuations."""
    punctuated = [d.name for d in definitions if enabled(d)]
    if not punctuated:
        return plan
    held = tuple(sorted(set(roles)))
    if isinstance(plan, JoinPlan):
        for d in definitions:
            if enabled(d) and d.source.kind != "ingest":
                # a join reads its sides' sources in a query of its own, whose side shield
                # reads an ingest stream's log: a files or kafka stream's punctuations are in
                # its records, learnt by the stream's own query only (not built for joins)
                raise Unprocessable(f"stream {d.name!r} carries security punctuations in its "
                                    f"{d.source.kind} records, which a join does not read "
                                    "yet; ask for the stream alone (docs/punctuations.md)",
                                    stream=d.name)
        # each side on a punctuated stream reads its own punctuations (the paper's SCJoin)
        sides = [replace(p, punctuation_roles=held) if p.stream in punctuated else p
                 for p in (plan.left, plan.right)]
        return replace(plan, left=sides[0], right=sides[1])
    if isinstance(plan, UnionPlan):
        return replace(plan, plans=tuple(replace(p, punctuation_roles=held)
                                         for p in plan.plans))
    return replace(plan, punctuation_roles=held)


def filter_attributes(plan: ExecutionPlan) -> tuple[str, ...]:
    """The attributes a plan's filter reads (the policy's and the consumer's conditions, a
    spatial test's coordinates and anchor key). A row in which a punctuation hides one of them
    reaches the consumer not at all: its presence would say how the hidden value compares."""
    names: list[str] = []
    for conj in plan.filter_dnf or ():
        for p in conj:
            if isinstance(p, SpatialPredicate):
                names += [p.latitude, p.longitude] + ([p.key] if p.key else [])
            else:
                names.append(p.attribute)
    return tuple(dict.fromkeys(names))


# -- the Security Shield's state ----------------------------------------------------------------

@dataclass(frozen=True)
class SegmentPolicy:
    """What governs the tuples of one s-punctuated segment: the current policy's punctuations,
    the immutable ones seen so far, and whether the current policy is complete."""

    current: tuple[Punctuation, ...] = ()
    fixed: tuple[Punctuation, ...] = ()
    complete: bool = True

    @property
    def empty(self) -> bool:
        return not self.current and not self.fixed

    @property
    def conditions(self) -> tuple[tuple[Condition, ...], ...]:
        """The distinct tuple DDPs in force (whose matches the runtime asks Spark for)."""
        return tuple(dict.fromkeys(p.where for p in self.current + self.fixed
                                   if p.where is not None))


@dataclass
class ShieldState:
    """The Security Shield's state (the paper's Fig. 10) as punctuations arrive in stream
    order: `add` one, `policy` for the tuples that follow. `discarded`: punctuations that came
    after a newer policy (out of order)."""

    ts: int | None = None
    current: list[Punctuation] = field(default_factory=list)
    fixed: list[Punctuation] = field(default_factory=list)
    discarded: int = 0

    def add(self, sp: Punctuation) -> None:
        if self.ts is None or sp.ts > self.ts:
            self.ts, self.current = sp.ts, [sp]
        elif sp.ts == self.ts:
            self.current.append(sp)
        else:
            self.discarded += 1
            return
        if sp.immutable and sp not in self.fixed:
            self.fixed.append(sp)

    def policy(self) -> SegmentPolicy:
        numbers = sorted(p.sn for p in self.current)
        complete = numbers == list(range(1, len(numbers) + 1))
        fixed = tuple(p for p in self.fixed if p not in self.current)
        return SegmentPolicy(tuple(self.current), fixed, complete)


def segments(entries: Iterable[tuple[int, Punctuation]]
             ) -> tuple[list[int], list[SegmentPolicy]]:
    """A stream's punctuations (position of the first tuple they precede, punctuation), in
    stream order, as segments: (the positions where each starts, increasing; its policy). A
    tuple at position p belongs to the last segment starting at or before p; before the first
    one, to `SegmentPolicy()` (no punctuation yet)."""
    state = ShieldState()
    starts: list[int] = []
    policies: list[SegmentPolicy] = []
    for at, sp in entries:
        state.add(sp)
        policy = state.policy()
        if starts and starts[-1] == at:
            policies[-1] = policy
        else:
            starts.append(at)
            policies.append(policy)
    return starts, policies


def lane_segments(entries: Iterable[tuple[int, Punctuation | None]],
                  state: ShieldState | None = None) -> tuple[list[int], list[SegmentPolicy]]:
    """`segments` of one lane of a `files` or `kafka` stream (a file, a partition: its own
    stream order, starting with no punctuation), where a `$punctuation` record that could not
    be read is None: the stream could not refuse it, and it may have narrowed the policy, so
    from it on every tuple is denied (`SegmentPolicy(complete=False)`) until a punctuation
    starts a newer policy (a `ts` above the current one's)."""
    state = ShieldState()
    doubt = False
    starts: list[int] = []
    policies: list[SegmentPolicy] = []
    for at, sp in entries:
        if sp is None:
            doubt = True
        else:
            doubt = doubt and not (state.ts is None or sp.ts > state.ts)
            state.add(sp)
        policy = SegmentPolicy(complete=False) if doubt else state.policy()
        if starts and starts[-1] == at:
            policies[-1] = policy
        else:
            starts.append(at)
            policies.append(policy)
    return starts, policies


# -- the verdict --------------------------------------------------------------------------------

REFINE, DEFER = "refine", "defer"


def visible_attributes(policy: SegmentPolicy, roles: frozenset[str], mode: str,
                       attributes: Sequence[str], matched: frozenset[tuple[Condition, ...]],
                       reads: Sequence[str] = ()) -> frozenset[str]:
    """Which of `attributes` a consumer with `roles` may see of a tuple of a segment under
    `policy` (`matched`: the tuple DDPs the tuple meets). A tuple none of whose attributes is
    visible reaches the consumer not at all; nor does one of which an attribute the consumer's
    filter `reads` is hidden (`filter_attributes`)."""
    if not policy.complete:
        return frozenset()
    if reads:
        seen = visible_attributes(policy, roles, mode, tuple(dict.fromkeys(
            [*attributes, *reads])), matched)
        if any(a not in seen for a in reads):
            return frozenset()
        return frozenset(a for a in attributes if a in seen)
    groups: list[tuple[Punctuation, ...]] = [policy.current] if policy.current else []
    groups += [(p,) for p in policy.fixed]
    out = []
    for a in attributes:
        granted = False
        denied = False
        for group in groups:
            covering = [p for p in group
                        if p.covers(a, p.where is None or p.where in matched)]
            if any(p.sign == NEGATIVE and p.roles & roles for p in covering):
                denied = True
                break
            positives = [p for p in covering if p.sign == POSITIVE]
            if positives:
                if not any(p.roles & roles for p in positives):
                    denied = True
                    break
                granted = True
        if not denied and (granted or mode == REFINE):
            out.append(a)
    return frozenset(out)


def counts_in_window(policy: SegmentPolicy, roles: frozenset[str], mode: str,
                     reads: Sequence[str], matched: frozenset[tuple[Condition, ...]]) -> bool:
    """Whether a tuple of a segment under `policy` counts in a consumer's windows, whose plan
    reads `reads` (its filter's attributes, its aggregates', keys', time's and label bounds':
    `pep.runtime.plans.compile.window_reads`): only when every one of them is visible to the
    consumer. A tuple a segment hides, wholly or in an attribute the window reads, is in none of its
    windows: it adds to no aggregate, numbers no tuple window's tuples, moves no time window's
    clock (an aggregate over the attributes left visible would still count it: its presence is
    what the segment hides). A window that reads nothing counts nothing (never built so)."""
    if not reads:
        return False
    seen = visible_attributes(policy, roles, mode, reads, matched)
    return all(a in seen for a in reads)


# -- the stream's log ---------------------------------------------------------------------------

LOG_NAME = ".punctuations.jsonl"  # in the ingest directory (Spark's file source skips it)


def log_line(at: int, sp: Punctuation) -> str:
    """One line of a stream's punctuation log: the position of the first tuple it precedes."""
    return json.dumps({"at": at, "sp": sp.to_json()}, separators=(",", ":"), sort_keys=True)


def read_log_line(line: str, types: Mapping[str, str]) -> tuple[int, Punctuation]:
    doc = json.loads(line)
    return int(doc["at"]), punctuation_from_json(doc["sp"], types)


# -- the oracle ---------------------------------------------------------------------------------

def visible_tuples(records: Iterable[Mapping[str, Any]], roles: frozenset[str], mode: str,
                   reads: Sequence[str], schema: StreamSchema) -> list[dict[str, Any]]:
    """The tuples of `records` (punctuation records and tuples in stream order) that count in
    a consumer's windows (`counts_in_window`), by brute force: the tests' oracle feeds them to a
    brute-force window computation."""
    state = ShieldState()
    out = []
    for record in records:
        if PUNCTUATION_KEY in record:
            state.add(parse_punctuation(record[PUNCTUATION_KEY], schema))
            continue
        policy = state.policy()
        matched = frozenset(c for c in policy.conditions
                            if all(x.holds(record.get(x.attribute)) for x in c))
        if counts_in_window(policy, roles, mode, reads, matched):
            out.append(dict(record))
    return out


def oracle(records: Iterable[Mapping[str, Any]], roles: frozenset[str], mode: str,
           projection: Sequence[str], schema: StreamSchema,
           passes: Any = None, reads: Sequence[str] = ()) -> list[dict[str, Any]]:
    """What a consumer gets of `records` (punctuation records and tuples in stream order, as an
    owner ingests them), by brute force: each tuple's segment, its verdict, the projection with
    hidden attributes null. `passes(record)`: the plan's filter (None: every tuple), which
    `reads` those attributes. A punctuation record that does not read (a `files` or `kafka`
    stream's, which nothing refused) denies every tuple after it until a newer policy starts
    (`lane_segments`)."""
    state = ShieldState()
    doubt = False
    out = []
    for record in records:
        if PUNCTUATION_KEY in record:
            try:
                if set(record) != {PUNCTUATION_KEY}:
                    raise PunctuationError("a punctuation record holds nothing else")
                sp = parse_punctuation(record[PUNCTUATION_KEY], schema)
            except PunctuationError:
                doubt = True
                continue
            doubt = doubt and not (state.ts is None or sp.ts > state.ts)
            state.add(sp)
            continue
        if passes is not None and not passes(record):
            continue
        if doubt:
            continue
        policy = state.policy()
        matched = frozenset(c for c in policy.conditions
                            if all(x.holds(record.get(x.attribute)) for x in c))
        seen = visible_attributes(policy, roles, mode, projection, matched, reads)
        if seen:
            out.append({a: (record.get(a) if a in seen else None) for a in projection})
    return out


__all__ = ["PUNCTUATION_KEY", "SOURCE_OPTION", "POSITIVE", "NEGATIVE", "REFINE", "DEFER",
           "Condition", "Punctuation", "PunctuationError", "SegmentPolicy", "ShieldState",
           "enabled", "shielded_plan", "filter_attributes", "parse_punctuation",
           "punctuation_from_json", "segments", "lane_segments", "visible_attributes",
           "counts_in_window",
           "visible_tuples", "LOG_NAME", "log_line", "read_log_line", "oracle"]
