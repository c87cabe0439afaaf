"""Bag functions (A.3.10) for every type: T-one-and-only, T-bag-size, T-is-in, T-bag.

Bags are tuples. Membership uses the type's XACML equality (`datatypes.values_equal`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdp import datatypes as dt
from pdp.functions.base import (
    LEGACY_DURATION_FAMILIES,
    TYPED_FAMILIES,
    Param,
    bag_result,
    fail,
    register,
)


def _one_and_only(function_id: str) -> Callable[[tuple[Any, ...]], Any]:
    def one_and_only(bag: tuple[Any, ...]) -> Any:
        if len(bag) != 1:
            raise fail(function_id, f"expected a bag of exactly one value, got {len(bag)}")
        return bag[0]
    return one_and_only


def _bag_size(bag: tuple[Any, ...]) -> int:
    return len(bag)


def _is_in(value: Any, bag: tuple[Any, ...]) -> bool:
    return any(dt.values_equal(value, member) for member in bag)


def _bag(function_id: str) -> Callable[..., tuple[Any, ...]]:
    def bag(*values: Any) -> tuple[Any, ...]:
        return bag_result(function_id, values)
    return bag


for _name, _type, _prefix in TYPED_FAMILIES + LEGACY_DURATION_FAMILIES:
    _single, _many = Param(_type), Param(_type, is_bag=True)
    _id = f"{_prefix}{_name}-one-and-only"
    register(_id, _type, (_many,), _one_and_only(_id))
    register(f"{_prefix}{_name}-bag-size", dt.INTEGER, (_many,), _bag_size)
    register(f"{_prefix}{_name}-is-in", dt.BOOLEAN, (_single, _many), _is_in)
    _id = f"{_prefix}{_name}-bag"
    register(_id, _type, (_single,), _bag(_id), returns_bag=True, variadic=True, min_args=0)
