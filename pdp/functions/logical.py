"""Logical functions (A.3.5). `and`, `or` and `n-of` are lazy: they receive thunks and
evaluate only what XACML's rules need, so that a True (or False) can win over an argument
that would have been Indeterminate.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdp import datatypes as dt
from pdp.errors import Indeterminate
from pdp.functions.base import F1, Param, fail, register

Thunk = Callable[[], Any]


def _boolean(function_id: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(function_id, f"expected a boolean argument, got {type(value).__name__}")
    return value


def _or(*thunks: Thunk) -> bool:
    """True if any argument is True; else Indeterminate if any was; else False."""
    pending: Indeterminate | None = None
    for thunk in thunks:
        try:
            if _boolean(F1 + "or", thunk()):
                return True
        except Indeterminate as exc:
            pending = pending or exc
    if pending is not None:
        raise pending
    return False


def _and(*thunks: Thunk) -> bool:
    """False if any argument is False; else Indeterminate if any was; else True."""
    pending: Indeterminate | None = None
    for thunk in thunks:
        try:
            if not _boolean(F1 + "and", thunk()):
                return False
        except Indeterminate as exc:
            pending = pending or exc
    if pending is not None:
        raise pending
    return True


def _n_of(count_thunk: Thunk, *thunks: Thunk) -> bool:
    """True if at least n of the boolean arguments are True.

    The arguments are evaluated in order and evaluation stops as soon as the result is
    known; Indeterminate arguments only matter when they could change it.
    """
    fid = F1 + "n-of"
    needed = count_thunk()
    if not isinstance(needed, int) or isinstance(needed, bool):
        raise fail(fid, "the first argument must be an integer")
    if needed > len(thunks):
        raise fail(fid, f"needs {needed} true arguments but only {len(thunks)} are given")
    if needed <= 0:
        return True
    true_count = 0
    pending: Indeterminate | None = None
    undecided = 0
    for index, thunk in enumerate(thunks):
        try:
            if _boolean(fid, thunk()):
                true_count += 1
                if true_count >= needed:
                    return True
        except Indeterminate as exc:
            pending = pending or exc
            undecided += 1
        remaining = len(thunks) - index - 1
        if true_count + undecided + remaining < needed:
            return False
    # Only reachable when Indeterminate arguments could have made up the difference.
    assert pending is not None
    raise pending


def _not(value: bool) -> bool:
    return not _boolean(F1 + "not", value)


_B = Param(dt.BOOLEAN)
register(F1 + "or", dt.BOOLEAN, (_B,), _or, variadic=True, lazy=True, min_args=0)
register(F1 + "and", dt.BOOLEAN, (_B,), _and, variadic=True, lazy=True, min_args=0)
register(F1 + "n-of", dt.BOOLEAN, (Param(dt.INTEGER), _B), _n_of, variadic=True, lazy=True,
         min_args=1)
register(F1 + "not", dt.BOOLEAN, (_B,), _not)
