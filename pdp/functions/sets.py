"""Set functions (A.3.11) for every type: intersection, at-least-one-member-of, union,
subset, set-equals. Results have no duplicates and keep first-seen order, so that decisions and
obligations are reproducible. union takes two or more bags (XACML 3.0).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdp import datatypes as dt
from pdp.datatypes import equality_key
from pdp.functions.base import (
    LEGACY_DURATION_FAMILIES,
    TYPED_FAMILIES,
    Param,
    bag_result,
    register,
)

Bag = tuple[Any, ...]


def _keys(bag: Bag) -> set[Any]:
    return {equality_key(v) for v in bag}


def _distinct(values: Any) -> list[Any]:
    """First occurrence of every XACML-distinct value, in order."""
    seen: dict[Any, Any] = {}
    for value in values:
        seen.setdefault(equality_key(value), value)
    return list(seen.values())


def _intersection(function_id: str) -> Callable[[Bag, Bag], Bag]:
    def intersection(a: Bag, b: Bag) -> Bag:
        other = _keys(b)
        return bag_result(function_id, (v for v in _distinct(a) if equality_key(v) in other))
    return intersection


def _at_least_one_member_of(a: Bag, b: Bag) -> bool:
    other = _keys(b)
    return any(equality_key(v) in other for v in a)


def _union(function_id: str) -> Callable[..., Bag]:
    def union(*bags: Bag) -> Bag:
        return bag_result(function_id, _distinct(v for bag in bags for v in bag))
    return union


def _subset(a: Bag, b: Bag) -> bool:
    other = _keys(b)
    return all(equality_key(v) in other for v in a)


def _set_equals(a: Bag, b: Bag) -> bool:
    return _keys(a) == _keys(b)


for _name, _type, _prefix in TYPED_FAMILIES + LEGACY_DURATION_FAMILIES:
    _bag = Param(_type, is_bag=True)
    _id = f"{_prefix}{_name}-intersection"
    register(_id, _type, (_bag, _bag), _intersection(_id), returns_bag=True)
    register(f"{_prefix}{_name}-at-least-one-member-of", dt.BOOLEAN, (_bag, _bag),
             _at_least_one_member_of)
    _id = f"{_prefix}{_name}-union"
    register(_id, _type, (_bag,), _union(_id), returns_bag=True, variadic=True, min_args=2)
    register(f"{_prefix}{_name}-subset", dt.BOOLEAN, (_bag, _bag), _subset)
    register(f"{_prefix}{_name}-set-equals", dt.BOOLEAN, (_bag, _bag), _set_equals)
