"""Higher-order bag functions (A.3.12): any-of, all-of, any-of-any, all-of-any, any-of-all,
all-of-all and map, under their 3.0 ids and the deprecated 1.0 ids.

The 1.0 forms are special cases of the 3.0 ones (1.0 any-of is (function, value, bag), 3.0
lets the single bag stand anywhere among any number of values), so both ids share one
implementation. A bag argument is a tuple; anything else is a single value.

When the applied function is Indeterminate for some elements, the boolean forms behave like
`or`/`and` over the applications: a decisive True (any-of) or False (all-of) still wins, else
the result is Indeterminate. The number of applications per call is bounded.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from pdp import datatypes as dt
from pdp.errors import Indeterminate
from pdp.functions.base import (
    F1,
    F3,
    FUNCTION_PARAM,
    Function,
    Param,
    bag_result,
    fail,
    register,
)

MAX_APPLICATIONS = 200_000

# Arguments are values of any data type, and tuples of them for bags: dynamic by nature (the
# policy compiler checks their types against the functions' signatures).
Call = tuple[Any, ...]  # the arguments of one application, or of one call
Bag = tuple[Any, ...]


class Quantifier(Protocol):
    """any-of, all-of and the other boolean forms: the function to apply, then the arguments
    (values, and tuples for bags)."""

    def __call__(self, inner: Function, /, *args: Any) -> bool: ...


class Mapper(Protocol):
    """map: as a Quantifier, but it gives the bag of the function's results."""

    def __call__(self, inner: Function, /, *args: Any) -> Bag: ...


def _apply(inner: Function, args: Call) -> Any:
    if inner.lazy:
        return inner.impl(*(lambda v=v: v for v in args))
    return inner.impl(*args)


def _predicate(function_id: str, inner: Function, args: Call) -> bool:
    result = _apply(inner, args)
    if not isinstance(result, bool):
        raise fail(function_id, f"{inner.short_name} did not return a boolean")
    return result


def _split_one_bag(function_id: str, args: Call) -> tuple[int, Bag]:
    positions = [i for i, a in enumerate(args) if isinstance(a, tuple)]
    if len(positions) != 1:
        raise fail(function_id, f"expected exactly one bag argument, got {len(positions)}")
    return positions[0], args[positions[0]]


def _check_inner(function_id: str, inner: object) -> Function:
    if not isinstance(inner, Function):
        raise fail(function_id, "the first argument must be a function")
    if inner.higher_order:
        raise fail(function_id, f"cannot apply the higher-order function {inner.short_name}")
    return inner


def _quantify(function_id: str, inner: Function, calls: Iterable[Call], want: bool) -> bool:
    """any (want=True) / all (want=False) over the applications, with or/and semantics."""
    pending: Indeterminate | None = None
    for count, args in enumerate(calls):
        if count >= MAX_APPLICATIONS:
            raise fail(function_id, f"more than {MAX_APPLICATIONS} applications")
        try:
            if _predicate(function_id, inner, args) == want:
                return want
        except Indeterminate as exc:
            pending = pending or exc
    if pending is not None:
        raise pending
    return not want


def _substituted(args: Call, position: int, bag: Bag) -> Iterator[Call]:
    for element in bag:
        yield args[:position] + (element,) + args[position + 1:]


def _make_any_of(function_id: str, want: bool) -> Quantifier:
    def any_or_all_of(inner: Function, *args: Any) -> bool:
        inner = _check_inner(function_id, inner)
        position, bag = _split_one_bag(function_id, args)
        return _quantify(function_id, inner, _substituted(args, position, bag), want)
    return any_or_all_of


def _make_any_of_any(function_id: str) -> Quantifier:
    def any_of_any(inner: Function, *args: Any) -> bool:
        inner = _check_inner(function_id, inner)
        if not args:
            raise fail(function_id, "needs at least one argument after the function")
        choices = [a if isinstance(a, tuple) else (a,) for a in args]
        return _quantify(function_id, inner, itertools.product(*choices), True)
    return any_of_any


def _two_bags(function_id: str, args: Call) -> tuple[Bag, Bag]:
    if len(args) != 2 or not all(isinstance(a, tuple) for a in args):
        raise fail(function_id, "expected exactly two bag arguments")
    if len(args[0]) * len(args[1]) > MAX_APPLICATIONS:
        raise fail(function_id, f"more than {MAX_APPLICATIONS} applications")
    return args[0], args[1]


def _make_nested(function_id: str, outer_want: bool, inner_want: bool) -> Quantifier:
    """outer/inner quantifiers: all-of-any = (all, any), any-of-all = (any, all),
    all-of-all = (all, all). want=True means 'any', False means 'all'."""

    def nested(inner: Function, *args: Any) -> bool:
        inner = _check_inner(function_id, inner)
        first, second = _two_bags(function_id, args)
        pending: Indeterminate | None = None
        for x in first:
            try:
                found = _quantify(function_id, inner, ((x, y) for y in second), inner_want)
            except Indeterminate as exc:
                pending = pending or exc
                continue
            if found == outer_want:
                return outer_want
        if pending is not None:
            raise pending
        return not outer_want
    return nested


def _make_map(function_id: str) -> Mapper:
    def map_(inner: Function, *args: Any) -> Bag:
        inner = _check_inner(function_id, inner)
        if inner.returns_bag:
            raise fail(function_id, f"{inner.short_name} returns a bag")
        position, bag = _split_one_bag(function_id, args)
        if len(bag) > MAX_APPLICATIONS:
            raise fail(function_id, f"more than {MAX_APPLICATIONS} applications")
        return bag_result(function_id, (_apply(inner, call)
                                        for call in _substituted(args, position, bag)))
    return map_


_F, _ANY = Param(FUNCTION_PARAM), Param(None)

for _prefix in (F3, F1):
    for _name, _want in (("any-of", True), ("all-of", False)):
        _id = _prefix + _name
        register(_id, dt.BOOLEAN, (_F, _ANY), _make_any_of(_id, _want), variadic=True,
                 min_args=2, higher_order=True, arg_shape="one-bag")
    _id = _prefix + "any-of-any"
    register(_id, dt.BOOLEAN, (_F, _ANY), _make_any_of_any(_id), variadic=True, min_args=2,
             higher_order=True, arg_shape="any")
    _id = _prefix + "map"
    register(_id, None, (_F, _ANY), _make_map(_id), returns_bag=True, variadic=True,
             min_args=2, higher_order=True, arg_shape="one-bag")

for _name, _outer, _inner in (("all-of-any", False, True), ("any-of-all", True, False),
                              ("all-of-all", False, False)):
    _id = F1 + _name
    register(_id, dt.BOOLEAN, (_F, Param(None, True), Param(None, True)),
             _make_nested(_id, _outer, _inner), higher_order=True, arg_shape="two-bags")
