"""The eXACML+ obligation vocabulary, turned into the policy side's query graph.

Accepted obligation ids (the design's spelling and the paper's Table 1 spelling):

    exacml:obligation:stream-filter  | exacml:obligation:stream-filtering
    exacml:obligation:stream-map     | exacml:obligation:stream-mapping
    exacml:obligation:stream-window  | exacml:obligation:stream-window-aggregation
    exacml:obligation:stream-mask    (xsg's own: attributes shown coarser or hashed)

Attribute ids carry either prefix `exacml:obligation:` or `pCloud:obligation:` (Figure 2 uses the
latter): `stream-filter-condition-id`, `stream-map-attribute-id`, `stream-window-type-id`,
`stream-window-size-id`, `stream-window-step-id`, `stream-window-attr-id` (`attribute:function`),
and three of xsg's own for windows:
- `stream-window-min-count-id`: a window holding fewer tuples is not emitted. Default: 1 for tuple
  windows (a tuple window always holds `size` tuples), 3 for time windows (a window of one tuple
  shows it raw; of two, an average and either value give the other; three is the fewest at which
  an average, a sum or a count alone shows no single value).
- `stream-window-filter-attribute-id` (repeated): the attributes a consumer's own filter may use
  before the window. Default: none. A consumer filter runs before the window, so a narrow one
  (a time range, a thin value band) would choose which few tuples a window aggregates; the
  eXACML+ paper conjoins the consumer's filter with the policy's before the window without this
  check, which lets a consumer steer a window onto a single tuple.
- `stream-window-key-id` (repeated): group-by attributes; aggregates are per key value per
  window, and a consumer may group by a subset of them, never by more.
- `stream-window-label-bound-id` (repeated): `attribute DOMINATED_BY label` on a label attribute
  (MLS, `pep.core.labels`; the label usually `{subject:session}`). By default only the tuples
  whose label the bound dominates enter the window (the MLS DSMS paper's shape: a filter before
  the window), so what a reader gets does not depend on tuples above it in any way, their
  values, their number, their times or their presence.
- `stream-window-label-scope-id`: `dominated` (that default) or `all`, the owner's explicit
  choice of the other shape: every tuple enters the window and a window is withheld unless the
  bound dominates the least upper bound of its tuples' labels. A withheld window tells its
  reader that a tuple above it was there, which is why `all` must be written out (and the
  policy's write answer warns, `presence_leaks`). Without a bound it is refused.
and four more for differentially private windows (`pep/core/privacy.py` says what they mean):
`stream-window-dp-epsilon-id`, `stream-window-dp-delta-id`, `stream-window-dp-bounds-id`
(`attribute:lower:upper`, repeated) and `stream-window-dp-budget-id` (`epsilon/seconds`,
repeated). An unknown or invalid one means deny, as every other attribute.

`stream-mask` carries `stream-mask-attribute-id` values (repeated), each `attribute:mask`
(`speed:round:10`, `lat,lon:grid:0.1`, `ts:truncate:minute`, `speed:bands:0,10,20`,
`shipname:prefix:3`, `mmsi:hash`, `shipname:null`; the vocabulary and its order are in
`pep.core.masks`). An unknown mask, a bad parameter or a mask on an attribute of the wrong type
means deny, as for any obligation.

`exacml:obligation:stream-grant-option` (xsg's own, after the `WITH GRANT OPTION` of the security
punctuations paper, section 4.3, Fig. 8a) carries no attribute: the consumer it is given to may
re-share what it gets (its handle's rows) as a derived stream of its own, under policies of its
own that are never wider than this grant (`pep.core.derived`). It does not change the view: the
graph ignores it (`policy_graph`), and a decision carries it only when every rule that permitted
it does (`grant_option`). An obligation of that id with any attribute means deny, as for any
other obligation the PEP cannot read.

An obligation the PEP does not understand, or one it cannot fulfil (bad value, unknown attribute,
missing or ambiguous placeholder), means deny: XACML 3.0 section 7.18. `ObligationError` carries
the reason.

When several applicable policies contribute obligations, all of them apply:
- filters are conjoined;
- maps are intersected (an attribute is visible only if every map exposes it);
- windows: the coarsest requirement wins. Every window must have the same type (else deny); the
  merged window has the largest size, step and minimum count of them, allows an aggregate
  (attribute, function), a pre-window filter attribute or a group-by key only if every window
  allows it (no aggregate left: deny). A window of size >= s and step >= t is at least as coarse
  as every policy asked. If any window is differentially private the merged one is, with the
  strictest parameters (`pep.core.privacy.strictest`).
- masks: per attribute, the coarsest of them (`round:10` over `round:5`); two masks neither of
  which is coarser (`round:4` and `round:6`, `hash` and `prefix:3`) cannot both be honoured:
  deny.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Literal

from common.numbers import INT64_MAX, NumberError, parse_int
from pdp import Obligation
from pep.core.conditions import (
    Comparison,
    ConditionError,
    Expr,
    PlaceholderResolver,
    conjoin,
    parse_condition,
)
from pep.core.graph import QueryGraph, pipeline_graph
from pep.core.labels import Label
from pep.core.masks import Mask, MaskError, compose_all, ordered, parse_assignment
from pep.core.plan import (
    AGGREGATE_FUNCTIONS,
    Aggregate,
    AggregateFunction,
    PolicyWindowTerms,
    StreamSchema,
    WindowSpec,
)
from pep.core.privacy import DP_ATTRIBUTES, check_aggregates, parse_spec, strictest

PREFIXES = ("exacml:obligation:", "pcloud:obligation:")
FILTER_IDS = frozenset({"exacml:obligation:stream-filter", "exacml:obligation:stream-filtering"})
MAP_IDS = frozenset({"exacml:obligation:stream-map", "exacml:obligation:stream-mapping"})
WINDOW_IDS = frozenset({"exacml:obligation:stream-window",
                        "exacml:obligation:stream-window-aggregation"})
MASK_IDS = frozenset({"exacml:obligation:stream-mask"})
GRANT_OPTION_IDS = frozenset({"exacml:obligation:stream-grant-option"})
GRANT_OPTION_ID = "exacml:obligation:stream-grant-option"
# xsg's own: the grant defers to the stream's security punctuations (`pep.core.punctuations`)
PUNCTUATION_DEFER_ID = "exacml:obligation:stream-punctuations-defer"
PUNCTUATION_DEFER_IDS = frozenset({PUNCTUATION_DEFER_ID})

FILTER_CONDITION = "stream-filter-condition-id"
MAP_ATTRIBUTE = "stream-map-attribute-id"
WINDOW_TYPE = "stream-window-type-id"
WINDOW_SIZE = "stream-window-size-id"
WINDOW_STEP = "stream-window-step-id"
WINDOW_ATTR = "stream-window-attr-id"
WINDOW_MIN_COUNT = "stream-window-min-count-id"
WINDOW_PREFILTER = "stream-window-filter-attribute-id"
WINDOW_KEY = "stream-window-key-id"
MASK_ATTRIBUTE = "stream-mask-attribute-id"
WINDOW_LABEL_BOUND = "stream-window-label-bound-id"
WINDOW_LABEL_SCOPE = "stream-window-label-scope-id"
LABEL_SCOPES = ("dominated", "all")  # the first is the default
DEFAULT_MIN_COUNT = {"tuple": 1, "time": 3}

MAX_WINDOW = 100_000_000  # tuples or seconds (over three years): a guard against typos

# The paper's spellings (Avg, LastValue, ...) and ours, case-insensitive.
FUNCTION_SPELLINGS: dict[str, AggregateFunction] = {
    "avg": "avg", "average": "avg", "mean": "avg",
    "max": "max", "maximum": "max",
    "min": "min", "minimum": "min",
    "sum": "sum",
    "count": "count",
    "firstval": "firstval", "firstvalue": "firstval", "first": "firstval",
    "first_value": "firstval",
    "lastval": "lastval", "lastvalue": "lastval", "last": "lastval", "last_value": "lastval",
    "lub": "lub",
}
# Functions that make sense per attribute type (avg/sum only over numbers).
FUNCTIONS_FOR_TYPE = {
    "double": frozenset({"avg", "max", "min", "sum", "count", "firstval", "lastval"}),
    "long": frozenset({"avg", "max", "min", "sum", "count", "firstval", "lastval"}),
    "timestamp": frozenset({"max", "min", "count", "firstval", "lastval"}),
    "string": frozenset({"max", "min", "count", "firstval", "lastval"}),
    "boolean": frozenset({"max", "min", "count", "firstval", "lastval"}),
    "label": frozenset({"count", "lub"}),
}


class ObligationError(ValueError):
    """An obligation the PEP cannot understand or fulfil: the request is denied with this reason."""

    def __init__(self, message: str, obligation_id: str | None = None) -> None:
        self.obligation_id = obligation_id
        self.message = message
        super().__init__(message)


def normalise_function(name: str) -> AggregateFunction | None:
    return FUNCTION_SPELLINGS.get(name.strip().lower())


def parse_aggregate(value: str, schema: StreamSchema) -> Aggregate:
    """`attribute:function` (or `function(attribute)`) to an Aggregate; ValueError says why."""
    text = value.strip()
    if text.endswith(")") and "(" in text:
        fn, _, rest = text[:-1].partition("(")
        attr = rest
    elif ":" in text:
        attr, _, fn = text.rpartition(":")
    else:
        raise ValueError(f"aggregate {value!r} must be written attribute:function")
    attr, fn = attr.strip(), fn.strip()
    field = schema.lookup(attr)
    if field is None:
        raise ValueError(f"aggregate {value!r} names unknown attribute {attr!r}")
    function = normalise_function(fn)
    if function is None:
        raise ValueError(f"aggregate {value!r} uses unknown function {fn!r}; known: "
                         "avg, max, min, sum, count, firstval, lastval")
    if function not in FUNCTIONS_FOR_TYPE.get(field.type, frozenset()):
        raise ValueError(f"aggregate {value!r}: {function} does not apply to {field.type} "
                         f"attribute {field.name!r}")
    return Aggregate(field.name, function)


def parse_window_number(value: str, what: str) -> int:
    try:  # a '+' is let through: XACML's integers may carry one
        number = parse_int(value.strip().removeprefix("+"), f"window {what}", high=INT64_MAX)
    except NumberError:
        raise ValueError(f"window {what} {value!r} is not a positive integer") from None
    if number < 1:
        raise ValueError(f"window {what} must be at least 1, not {number}")
    if number > MAX_WINDOW:
        raise ValueError(f"window {what} {number} is over the limit of {MAX_WINDOW}")
    return number


def parse_window_kind(value: str) -> Literal["tuple", "time"]:
    kind = value.strip().lower()
    if kind == "tuple":
        return "tuple"
    if kind == "time":
        return "time"
    raise ValueError(f"window type {value!r} must be 'tuple' or 'time'")


PolicyWindow = tuple[WindowSpec, PolicyWindowTerms]
"""One policy's window: the window it grants and what only a policy says of it."""


def _suffix(attribute_id: str) -> str | None:
    low = attribute_id.lower()
    for prefix in PREFIXES:
        if low.startswith(prefix):
            return attribute_id[len(prefix):]
    return None


def obligation_assignments(ob: Obligation, allowed: Sequence[str]) -> dict[str, list[str]]:
    """The values of each allowed assignment of `ob`, by suffix; ObligationError (deny) for an
    assignment the PEP does not understand."""
    found: dict[str, list[str]] = {name: [] for name in allowed}
    for a in ob.assignments:
        suffix = _suffix(a.attribute_id)
        if suffix not in found:
            raise ObligationError(
                f"obligation {ob.id} carries attribute {a.attribute_id!r}, which the PEP does "
                f"not understand (expected {', '.join(allowed)} under prefix exacml:obligation: "
                "or pCloud:obligation:)", ob.id)
        found[suffix].append(a.value)
    return found


def is_grant_option(ob: Obligation) -> bool:
    """Whether `ob` is the grant option (ObligationError when it is, but carries attributes:
    the PEP cannot tell what they would mean, so the decision is a deny)."""
    if ob.id not in GRANT_OPTION_IDS:
        return False
    if ob.assignments:
        raise ObligationError(
            f"obligation {ob.id} carries attribute(s) "
            f"{', '.join(sorted({a.attribute_id for a in ob.assignments}))}; the grant option "
            "takes none", ob.id)
    return True


def is_punctuation_defer(ob: Obligation) -> bool:
    """Whether `ob` is the punctuations' deferral (raises ObligationError if it carries any
    attribute: it takes none)."""
    if ob.id not in PUNCTUATION_DEFER_IDS:
        return False
    if ob.assignments:
        raise ObligationError(f"obligation {ob.id} carries attribute(s); it takes none", ob.id)
    return True


def punctuation_defer(grants: Iterable[Iterable[Obligation]]) -> bool:
    """Whether a decision defers to the stream's security punctuations: every grant behind it
    carries `stream-punctuations-defer` (one permitting rule without it keeps the punctuations
    narrowing only: `pep.core.punctuations`)."""
    found = False
    for obligations in grants:
        if not any(is_punctuation_defer(ob) for ob in obligations):
            return False
        found = True
    return found


def grant_option(grants: Iterable[Iterable[Obligation]]) -> bool:
    """Whether a decision gives its consumer the grant option: every grant behind it (one per
    rule that permitted it, `pdp.RuleGrant`) carries it. One permitting rule without it is
    enough to withhold it: all of the rules' obligations apply, and the one that does not let
    the consumer re-share is one of them."""
    found = False
    for obligations in grants:
        if not any(is_grant_option(ob) for ob in obligations):
            return False
        found = True
    return found


def policy_graph(obligations: Iterable[Obligation], stream: str, schema: StreamSchema, *,
                 resolver: PlaceholderResolver | None = None) -> QueryGraph:
    """The policy side's graph for one decision's obligations (all of them apply)."""
    filters: list[tuple[Expr, str]] = []
    maps: list[set[str]] = []
    windows: list[PolicyWindow] = []
    masks: dict[str, Mask] = {}
    for ob in obligations:
        if ob.id in FILTER_IDS:
            values = obligation_assignments(ob, [FILTER_CONDITION])[FILTER_CONDITION]
            if not values:
                raise ObligationError(f"obligation {ob.id} has no {FILTER_CONDITION}", ob.id)
            for text in values:
                try:
                    filters.append((parse_condition(text, schema, resolver=resolver), text.strip()))
                except ConditionError as exc:
                    raise ObligationError(
                        f"obligation {ob.id}: filter condition {text.strip()!r}: {exc}", ob.id
                    ) from None
        elif ob.id in MAP_IDS:
            values = obligation_assignments(ob, [MAP_ATTRIBUTE])[MAP_ATTRIBUTE]
            if not values:
                raise ObligationError(f"obligation {ob.id} lists no visible attribute", ob.id)
            visible = set()
            for name in values:
                field = schema.lookup(name.strip())
                if field is None:
                    raise ObligationError(
                        f"obligation {ob.id}: stream {stream!r} has no attribute {name.strip()!r}",
                        ob.id)
                visible.add(field.name)
            maps.append(visible)
        elif ob.id in WINDOW_IDS:
            try:
                window, entry = _window(ob, schema, resolver)
            except ConditionError as exc:
                raise ObligationError(f"obligation {ob.id}: {exc}", ob.id) from None
            windows.append(window)
            filters.extend(entry)
        elif ob.id in MASK_IDS:
            masks = _masks(ob, schema, masks)
        elif is_grant_option(ob) or is_punctuation_defer(ob):
            continue  # what the consumer may do with its rows, or the punctuations' part
        else:
            raise ObligationError(
                f"obligation {ob.id!r} is not understood by this PEP; the request is denied "
                "(XACML 3.0 section 7.18)", ob.id)

    filter_part = None
    if filters:
        condition = conjoin([f[0] for f in filters])
        text = " AND ".join(f"({t})" if len(filters) > 1 else t for _, t in filters)
        filter_part = (condition, text)
    map_part = None
    if maps:
        visible = set.intersection(*maps)
        map_part = tuple(n for n in schema.names if n in visible)
    window_part = terms = None
    if windows:
        w, terms = merge_policy_windows(windows)
        # Canonical order (schema, then function), so that the plan - and its key, which decides
        # whether a live handle survives a policy change - does not depend on policy order.
        position = {name: i for i, name in enumerate(schema.names)}
        aggregates = tuple(sorted(w.aggregates, key=lambda a: (
            position[a.attribute], AGGREGATE_FUNCTIONS.index(a.function))))
        window_part = replace(
            w, aggregates=aggregates, keys=_in_schema_order(w.keys, schema),
            privacy=None if w.privacy is None
            else strictest([w.privacy], schema.names),  # bounds in schema order
            label_bounds=tuple(sorted(w.label_bounds)))
        terms = PolicyWindowTerms(_in_schema_order(terms.prefilter, schema))
    return pipeline_graph(stream, filter=filter_part, map=map_part, window=window_part,
                          policy_window=terms, mask=ordered(masks, schema) if masks else None)


def _masks(ob: Obligation, schema: StreamSchema, into: dict[str, Mask]) -> dict[str, Mask]:
    """The obligation's masks composed with those found so far (all of them apply)."""
    values = obligation_assignments(ob, [MASK_ATTRIBUTE])[MASK_ATTRIBUTE]
    if not values:
        raise ObligationError(f"obligation {ob.id} lists no {MASK_ATTRIBUTE} (attribute:mask)",
                              ob.id)
    try:
        for text in values:
            into = compose_all(parse_assignment(text, schema), into)
    except MaskError as exc:
        raise ObligationError(f"obligation {ob.id}: {exc}", ob.id) from None
    return into


def _in_schema_order(names: Iterable[str], schema: StreamSchema) -> tuple[str, ...]:
    wanted = set(names)
    return tuple(n for n in schema.names if n in wanted)


def _attribute_names(values: Iterable[str], schema: StreamSchema, what: str) -> tuple[str, ...]:
    names = []
    for value in values:
        field = schema.lookup(value.strip())
        if field is None:
            raise ValueError(f"{what} names unknown attribute {value.strip()!r}")
        names.append(field.name)
    return tuple(dict.fromkeys(names))


def _window(ob: Obligation, schema: StreamSchema, resolver: PlaceholderResolver | None = None
            ) -> tuple[PolicyWindow, list[tuple[Expr, str]]]:
    """The obligation's window, and the filters it puts before the window: its label bounds,
    unless its label scope is `all` (then they are the window's, see the module docstring)."""
    found = obligation_assignments(ob, [WINDOW_TYPE, WINDOW_SIZE, WINDOW_STEP, WINDOW_ATTR,
                              WINDOW_MIN_COUNT, WINDOW_PREFILTER, WINDOW_KEY,
                              WINDOW_LABEL_BOUND, WINDOW_LABEL_SCOPE, *DP_ATTRIBUTES])
    for name in (WINDOW_TYPE, WINDOW_SIZE, WINDOW_STEP):
        if len(found[name]) != 1:
            raise ObligationError(
                f"obligation {ob.id} needs exactly one {name}, found {len(found[name])}", ob.id)
    if len(found[WINDOW_MIN_COUNT]) > 1:
        raise ObligationError(f"obligation {ob.id} has more than one {WINDOW_MIN_COUNT}", ob.id)
    if not found[WINDOW_ATTR]:
        raise ObligationError(f"obligation {ob.id} lists no {WINDOW_ATTR} (attribute:function)",
                              ob.id)
    try:
        kind = parse_window_kind(found[WINDOW_TYPE][0])
        size = parse_window_number(found[WINDOW_SIZE][0], "size")
        step = parse_window_number(found[WINDOW_STEP][0], "step")
        aggregates = tuple(dict.fromkeys(parse_aggregate(v, schema) for v in found[WINDOW_ATTR]))
        min_count = (parse_window_number(found[WINDOW_MIN_COUNT][0], "minimum count")
                     if found[WINDOW_MIN_COUNT] else DEFAULT_MIN_COUNT[kind])
        keys = _attribute_names(found[WINDOW_KEY], schema, "a group-by key")
        prefilter = _attribute_names(found[WINDOW_PREFILTER], schema, "a pre-window filter")
        privacy = parse_spec(found, lambda name: (lambda f: None if f is None
                                                  else (f.name, f.type))(schema.lookup(name)))
        if privacy is not None:
            check_aggregates(privacy, aggregates)
        scope = label_scope(found[WINDOW_LABEL_SCOPE])  # first: it reads no placeholder
        bounds = [(_label_bound(text, schema, resolver), text.strip())
                  for text in found[WINDOW_LABEL_BOUND]]
    except ValueError as exc:
        raise ObligationError(f"obligation {ob.id}: {exc}", ob.id) from None
    if found[WINDOW_LABEL_SCOPE] and not bounds:
        raise ObligationError(f"obligation {ob.id}: {WINDOW_LABEL_SCOPE} says which tuples "
                              f"enter a window that has a {WINDOW_LABEL_BOUND}, and this one "
                              "has none", ob.id)
    if kind == "tuple" and min_count > size:
        raise ObligationError(f"obligation {ob.id}: a tuple window of {size} tuples can never "
                              f"hold the minimum of {min_count}", ob.id)
    withheld: tuple[tuple[str, str], ...] = ()
    entry: list[tuple[Expr, str]] = []
    if scope == "all":  # the owner's explicit choice: every tuple enters, windows are withheld
        withheld = tuple((c.attribute, str(c.value)) for c, _ in bounds)
    else:  # the paper's: only the tuples the bound dominates enter the window
        entry = [(c, text) for c, text in bounds]
    return ((WindowSpec(kind, size, step, aggregates, None, min_count, keys, privacy, withheld),
             PolicyWindowTerms(prefilter)), entry)


def label_scope(values: Sequence[str]) -> str:
    """A window's label scope (`dominated` when none is given); ValueError says why not."""
    if len(values) > 1:
        raise ValueError(f"more than one {WINDOW_LABEL_SCOPE}")
    if not values:
        return LABEL_SCOPES[0]
    scope = values[0].strip().lower()
    if scope not in LABEL_SCOPES:
        raise ValueError(f"{WINDOW_LABEL_SCOPE} {values[0].strip()[:40]!r} must be 'dominated' "
                         "(only the tuples the bound dominates enter the window) or 'all' "
                         "(every tuple enters, and a window above the bound is withheld)")
    return scope


def presence_leaks(ob: Obligation) -> list[str]:
    """The label bounds, as written, of a window obligation whose owner chose the label scope
    `all`: each lets a reader who gets no window learn that a tuple above the bound was there.
    Empty for any other obligation, and for one the PEP would refuse (its error says why)."""
    if ob.id not in WINDOW_IDS:
        return []
    scopes: list[str] = []
    bounds: list[str] = []
    for a in ob.assignments:
        suffix = _suffix(a.attribute_id)
        if suffix == WINDOW_LABEL_SCOPE:
            scopes.append(a.value)
        elif suffix == WINDOW_LABEL_BOUND:
            bounds.append(a.value.strip())
    try:
        return bounds if label_scope(scopes) == "all" else []
    except ValueError:
        return []


def _label_bound(text: str, schema: StreamSchema, resolver: PlaceholderResolver | None
                 ) -> Comparison:
    """`level DOMINATED_BY {subject:session}`: one label attribute dominated by one label
    (canonical: one attribute has one lattice)."""
    condition = parse_condition(text, schema, resolver=resolver)
    if not isinstance(condition, Comparison) or condition.op != "<=" \
            or not isinstance(condition.value, Label):
        raise ValueError(f"{WINDOW_LABEL_BOUND} {text.strip()[:80]!r} must be one "
                         "`attribute DOMINATED_BY label` on a label attribute")
    return condition


def merge_policy_windows(policies: Sequence[PolicyWindow]) -> PolicyWindow:
    """The coarsest window that respects every policy's (see the module docstring)."""
    windows = [w for w, _ in policies]
    terms = [t for _, t in policies]
    kinds = {w.kind for w in windows}
    if len(kinds) > 1:
        raise ObligationError("applicable policies require windows of different types "
                              f"({' and '.join(sorted(kinds))}); no window satisfies all of them")
    allowed = set(windows[0].aggregates)
    for w in windows[1:]:
        allowed &= set(w.aggregates)
    if not allowed:
        raise ObligationError("applicable policies' windows allow no aggregate in common")
    ordered = tuple(a for a in windows[0].aggregates if a in allowed)
    keys = set(windows[0].keys).intersection(*(w.keys for w in windows[1:]))
    prefilter = set(terms[0].prefilter).intersection(*(t.prefilter for t in terms[1:]))
    private = [w.privacy for w in windows if w.privacy is not None]
    privacy = None
    if private:
        try:
            privacy = strictest(private)  # one spec too: bounds in a canonical order
        except ValueError as exc:
            raise ObligationError(str(exc)) from None
    bounds = tuple(dict.fromkeys(b for w in windows for b in w.label_bounds))
    return (WindowSpec(windows[0].kind, max(w.size for w in windows),
                       max(w.step for w in windows), ordered, None,
                       max(w.min_count for w in windows), tuple(sorted(keys)), privacy, bounds),
            PolicyWindowTerms(tuple(sorted(prefilter))))
