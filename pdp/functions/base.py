"""The function model shared by every family module, and the registry they fill.

A family module describes its functions with `register(...)`; `pdp.functions` imports every
family so that importing the package yields the complete standard library.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdp.datatypes import canonical_datatype_id
from pdp.errors import Indeterminate
from pdp.results import STATUS_PROCESSING_ERROR

F1 = "urn:oasis:names:tc:xacml:1.0:function:"
F2 = "urn:oasis:names:tc:xacml:2.0:function:"
F3 = "urn:oasis:names:tc:xacml:3.0:function:"

FUNCTION_PARAM = "function"  # Param.type of the function argument of a higher-order function

# Hostile-input bounds: a policy or request must not make one function call eat the machine.
MAX_STRING_CHARS = 4 * 1024 * 1024
MAX_BAG_SIZE = 100_000
MAX_INTEGER_BITS = 64 * 1024


@dataclass(frozen=True)
class Param:
    """One formal parameter: a datatype URI (None: any type; "function": a function) and
    whether it is a bag."""

    type: str | None
    is_bag: bool = False


@dataclass(frozen=True)
class Function:
    """A standard XACML function.

    Arity: when `variadic` is False the call takes exactly `len(params)` arguments. When it is
    True the last Param repeats: the first `len(params) - 1` arguments match `params[:-1]`,
    every further argument matches `params[-1]`, and there must be at least `min_args`
    arguments in all (`min_args` defaults to `len(params) - 1`, i.e. zero repetitions;
    e.g. integer-add has min_args=2, and, or and T-bag have 0). `max_args` is None when variadic.
    For higher-order functions these counts include the leading function argument.

    Calling (`impl`):
    - plain functions: `impl(*args)`; each argument is a raw value (what `DataType.parse`
      returns) or, for a bag parameter, a tuple of raw values. A bag result is a tuple.
    - `lazy` functions (and, or, n-of): `impl(*thunks)`, each thunk a zero-argument callable
      returning the raw value or raising Indeterminate; the function evaluates only as many as
      XACML's short-circuit rules need.
    - `higher_order` functions: `impl(function, *args)` where `function` is the Function named
      by the policy's <Function> element and each arg is a raw value or a tuple (a bag). Their
      params after the first are `Param(None)`: which arguments are bags is decided by the call
      (see `signature_error`). `return_type` is None for map, whose bag has the element type
      of its function's result (see `result_type`).
    Evaluation errors raise Indeterminate with status processing-error and a message that
    names the function.
    """

    id: str
    return_type: str | None
    returns_bag: bool
    params: tuple[Param, ...]
    impl: Callable[..., Any] = field(repr=False)
    variadic: bool = False
    lazy: bool = False
    min_args: int | None = None
    higher_order: bool = False
    # Higher-order only: "one-bag" (exactly one argument is a bag: any-of, all-of, map),
    # "two-bags" (exactly two, both bags: all-of-any, any-of-all, all-of-all) or "any"
    # (any mix: any-of-any).
    arg_shape: str | None = None

    def __post_init__(self) -> None:
        if self.min_args is None:
            default = len(self.params) - 1 if self.variadic else len(self.params)
            object.__setattr__(self, "min_args", default)

    @property
    def short_name(self) -> str:
        return self.id.rsplit(":", 1)[-1]

    @property
    def max_args(self) -> int | None:
        return None if self.variadic else len(self.params)

    def accepts_arity(self, count: int) -> bool:
        assert self.min_args is not None
        return count >= self.min_args and (self.variadic or count == len(self.params))

    def param_at(self, index: int) -> Param:
        """The formal parameter that the index-th argument (0-based) must match."""
        if index < len(self.params):
            return self.params[index]
        if not self.variadic:
            raise IndexError(f"{self.short_name} takes {len(self.params)} arguments")
        return self.params[-1]

    def result_type(self, inner: Function | None = None) -> tuple[str | None, bool]:
        """(datatype URI, is bag) of a call's result; map needs the function it applies."""
        if self.return_type is None and inner is not None:
            return inner.return_type, True
        return self.return_type, self.returns_bag


def fail(function_id: str, message: str) -> Indeterminate:
    """The Indeterminate to raise when a function cannot produce a value."""
    name = function_id.rsplit(":", 1)[-1]
    return Indeterminate(f"function {name}: {message}", status_code=STATUS_PROCESSING_ERROR)


FUNCTIONS: dict[str, Function] = {}


def _guarded(function_id: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    """Turns stray Python errors (overflow, bad operand) into Indeterminate naming the function,
    so a hostile value can never crash a decision."""

    def call(*args: Any) -> Any:
        try:
            return impl(*args)
        except Indeterminate:
            raise
        except (ArithmeticError, ValueError, TypeError, MemoryError, RecursionError) as exc:
            raise fail(function_id, f"{type(exc).__name__}: {exc}") from None

    call.__name__ = getattr(impl, "__name__", "impl")
    call.__doc__ = impl.__doc__
    call.__wrapped__ = impl  # type: ignore[attr-defined]  # as functools.wraps sets it
    return call


def register(
    function_id: str,
    return_type: str | None,
    params: Iterable[Param],
    impl: Callable[..., Any],
    *,
    returns_bag: bool = False,
    variadic: bool = False,
    lazy: bool = False,
    min_args: int | None = None,
    higher_order: bool = False,
    arg_shape: str | None = None,
) -> Function:
    if function_id in FUNCTIONS:
        raise RuntimeError(f"function {function_id} registered twice")
    func = Function(
        id=function_id,
        return_type=return_type,
        returns_bag=returns_bag,
        params=tuple(params),
        impl=_guarded(function_id, impl),
        variadic=variadic,
        lazy=lazy,
        min_args=min_args,
        higher_order=higher_order,
        arg_shape=arg_shape,
    )
    FUNCTIONS[function_id] = func
    return func


def get_function(id: str) -> Function:  # mirrors the XACML FunctionId
    """The function with this id; KeyError (naming the id) if it is not supported."""
    try:
        return FUNCTIONS[id]
    except KeyError:
        raise KeyError(f"unknown function {id!r}") from None


def bag_result(function_id: str, values: Iterable[Any]) -> tuple[Any, ...]:
    """Materializes a bag result, refusing to build one larger than MAX_BAG_SIZE."""
    out = []
    for value in values:
        out.append(value)
        if len(out) > MAX_BAG_SIZE:
            raise fail(function_id, f"result bag larger than {MAX_BAG_SIZE} values")
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Static checking, for the policy loader.

ArgSig = tuple[str | None, bool]  # (datatype URI or None when unknown, is bag)


def _type_matches(expected: str | None, actual: str | None) -> bool:
    if expected is None or actual is None:
        return True
    return canonical_datatype_id(expected) == canonical_datatype_id(actual)


def signature_error(
    func: Function, args: Sequence[ArgSig], inner: Function | None = None
) -> str | None:
    """Checks a call's argument types; returns a message naming the problem, or None if fine.

    `args` describes each argument as (datatype URI, is bag); for a higher-order function,
    give `inner` (the Function of its <Function> argument) and describe only the arguments
    after it.
    """
    name = func.short_name
    if func.higher_order:
        return _higher_order_error(func, args, inner)
    if not func.accepts_arity(len(args)):
        wanted = (f"at least {func.min_args}" if func.variadic else str(len(func.params)))
        return f"{name} takes {wanted} arguments, got {len(args)}"
    for index, (dtype, is_bag) in enumerate(args):
        param = func.param_at(index)
        if param.is_bag != is_bag:
            wanted, got = (
                ("a bag", "a single value") if param.is_bag else ("a single value", "a bag")
            )
            return f"{name}: argument {index + 1} must be {wanted}, not {got}"
        if not _type_matches(param.type, dtype):
            return f"{name}: argument {index + 1} must be of type {param.type}, not {dtype}"
    return None


def _higher_order_error(
    func: Function, args: Sequence[ArgSig], inner: Function | None
) -> str | None:
    name = func.short_name
    if inner is None:
        return f"{name}: the first argument must be a <Function>"
    if inner.higher_order or inner.lazy:
        return f"{name}: cannot apply {inner.short_name}"
    bag_count = sum(1 for _, is_bag in args if is_bag)
    arity = len(args)
    shape = func.arg_shape
    if shape == "one-bag":  # any-of, all-of, map: exactly one bag among the arguments
        if arity < 1 or bag_count != 1:
            return f"{name} needs exactly one bag argument"
    elif shape == "two-bags":  # all-of-any, any-of-all, all-of-all: (bag, bag)
        if arity != 2 or bag_count != 2:
            return f"{name} takes exactly two bag arguments"
    elif arity < 1:
        return f"{name} needs at least one argument after the function"
    if inner.return_type is not None and func.return_type is not None:
        if not _type_matches(func.return_type, inner.return_type) or inner.returns_bag:
            return f"{name}: {inner.short_name} must return a single {func.return_type}"
    if inner.returns_bag:
        return f"{name}: {inner.short_name} must return a single value"
    element_sigs = [(dtype, False) for dtype, _ in args]
    error = signature_error(inner, element_sigs)
    return f"{name}: {error}" if error else None


# --------------------------------------------------------------------------------------------
# Which types get the generic per-type families, and under which id prefix.

from pdp import datatypes as _dt  # noqa: E402  (kept next to the table it serves)

# (short name, datatype URI, id prefix). XACML 1.0 types keep their 1.0 ids; the durations got
# 3.0 ids; ipAddress and dnsName came with XACML 2.0.
TYPED_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("string", _dt.STRING, F1),
    ("boolean", _dt.BOOLEAN, F1),
    ("integer", _dt.INTEGER, F1),
    ("double", _dt.DOUBLE, F1),
    ("time", _dt.TIME, F1),
    ("date", _dt.DATE, F1),
    ("dateTime", _dt.DATETIME, F1),
    ("anyURI", _dt.ANYURI, F1),
    ("hexBinary", _dt.HEXBINARY, F1),
    ("base64Binary", _dt.BASE64BINARY, F1),
    ("dayTimeDuration", _dt.DAYTIMEDURATION, F3),
    ("yearMonthDuration", _dt.YEARMONTHDURATION, F3),
    ("x500Name", _dt.X500NAME, F1),
    ("rfc822Name", _dt.RFC822NAME, F1),
    ("ipAddress", _dt.IPADDRESS, F2),
    ("dnsName", _dt.DNSNAME, F2),
)

# XACML 1.0/2.0 ids of the duration functions, still accepted, typed with the legacy URIs.
LEGACY_DURATION_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("dayTimeDuration", _dt.LEGACY_DAYTIMEDURATION, F1),
    ("yearMonthDuration", _dt.LEGACY_YEARMONTHDURATION, F1),
)
