"""What targets say about which requests they match, proven Match by Match (never guessed).

A Target holds when each of its AnyOfs does; an AnyOf when one of its AllOfs does; an AllOf when
each of its Matches does. A rule applies only when every target on its path holds (its policies'
and its own).

* **Implication** (`implies`): "whenever these targets hold, those do too", shown when every AnyOf
  of the second has, among the AnyOfs of the first, one each of whose AllOfs holds every Match
  of some AllOf of the second (the same function, literal, attribute and issuer). Sound for any
  attribute; it may miss implications it cannot see (no false "shadowed").
* **Contradiction** (`contradiction`): "no request matches all of these". Shown only through the
  attributes a stream request holds exactly one value of (`SINGLE_VALUED`: the subject-id the
  gateway binds, the stream's resource-id, the action-id, the join partner the gateway sets):
  an AnyOf whose every AllOf pins one of them (an equality Match) restricts it to those values,
  an AllOf that pins it to two different values never holds, and AnyOfs whose restrictions do not
  meet cannot hold together. Everything else (other attributes, other functions, conditions) is
  taken to be able to hold, so a contradiction found is real; two rules not found contradictory
  "can both apply", as far as their targets tell.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from pdp import (
    ACCESS_SUBJECT,
    ACTION,
    ACTION_ID,
    FAST_EQUAL_FUNCTIONS,
    JOIN_WITH,
    RESOURCE,
    RESOURCE_ID,
    SUBJECT_ID,
    AttributeKey,
    MatchNote,
    TargetNote,
    attribute_key,
)

SINGLE_VALUED: frozenset[AttributeKey] = frozenset({
    attribute_key(ACCESS_SUBJECT, SUBJECT_ID),
    attribute_key(RESOURCE, RESOURCE_ID),
    attribute_key(ACTION, ACTION_ID),
    attribute_key(RESOURCE, JOIN_WITH),
})


def _same(a: MatchNote, b: MatchNote) -> bool:
    return (a.function, a.value, a.key, a.issuer) == (b.function, b.value, b.key, b.issuer)


def _holds_all(strong: Sequence[MatchNote], weak: Sequence[MatchNote]) -> bool:
    """An AllOf with the Matches `strong` holds every Match of the AllOf `weak`."""
    return all(any(_same(w, s) for s in strong) for w in weak)


def implies(these: Iterable[TargetNote], those: Iterable[TargetNote]) -> bool:
    """Whenever all of `these` targets hold, all of `those` hold (see the module docstring)."""
    have = [any_of for target in these for any_of in target]
    for any_of in (a for target in those for a in target):
        if not any(all(any(_holds_all(b, a) for a in any_of) for b in mine) for mine in have):
            return False
    return True


def _pinned(all_of: Sequence[MatchNote]) -> dict[AttributeKey, set[object]] | None:
    """The single-valued attributes an AllOf pins to a value, each with the values it says
    (more than one: the AllOf never holds); None when it pins none."""
    pins: dict[AttributeKey, set[object]] = {}
    for m in all_of:
        if m.key in SINGLE_VALUED and m.function in FAST_EQUAL_FUNCTIONS and m.issuer is None:
            pins.setdefault(m.key, set()).add(m.value)
    return pins or None


def contradiction(targets: Iterable[TargetNote]) -> str | None:
    """Why no request can match all of `targets`, or None when none is shown."""
    allowed: dict[AttributeKey, set[object]] = {}
    for target in targets:
        for any_of in target:
            options: dict[AttributeKey, set[object]] | None = None
            possible = False
            for all_of in any_of:
                pins = _pinned(all_of)
                if pins is not None and any(len(v) > 1 for v in pins.values()):
                    continue  # this AllOf never holds
                possible = True
                if pins is None:
                    options = None
                    break  # an AllOf that pins nothing: the AnyOf restricts nothing
                if options is None:
                    options = {k: set(v) for k, v in pins.items()}
                else:  # keep only what every AllOf pins, with the values of each
                    options = {k: options[k] | pins[k] for k in options if k in pins}
            if not possible:  # every AllOf pins an attribute to two values
                pins = _pinned(any_of[0]) or {}
                key, values = next((k, v) for k, v in pins.items() if len(v) > 1)
                said = " and ".join(sorted(repr(v) for v in values))
                return f"it asks {_short(key[1])} to be {said} at once, and a request has one"
            for key, values in (options or {}).items():
                if key in allowed:
                    both = allowed[key] & values
                    if not both:
                        said = " or ".join(sorted(repr(v) for v in allowed[key]))
                        now = " or ".join(sorted(repr(v) for v in values))
                        return (f"one target asks {_short(key[1])} to be {said}, another "
                                f"{now}, and a request has one")
                    allowed[key] = both
                else:
                    allowed[key] = set(values)
    return None


def _short(attribute_id: str) -> str:
    return attribute_id.rsplit(":", 1)[-1]


def pinned_values(targets: Iterable[TargetNote], key: AttributeKey) -> frozenset[object] | None:
    """The values of a single-valued attribute with which all of `targets` can hold (None: any
    value, as far as the targets tell)."""
    allowed: set[object] | None = None
    for target in targets:
        for any_of in target:
            values: set[object] = set()
            for all_of in any_of:
                pins = _pinned(all_of)
                if pins is None or key not in pins:
                    break
                if len(pins[key]) == 1:
                    values |= pins[key]
            else:
                allowed = values if allowed is None else allowed & values
    return None if allowed is None else frozenset(allowed)


__all__ = ["implies", "contradiction", "pinned_values", "SINGLE_VALUED"]
