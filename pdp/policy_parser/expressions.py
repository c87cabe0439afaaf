"""Expressions: AttributeValue literals, AttributeDesignators, Apply (type-checked against the
function's signature, and folded when its arguments are constant) and VariableReferences."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lxml import etree

from pdp.datatypes import canonical_datatype_id
from pdp.errors import Indeterminate, ValueSyntaxError
from pdp.evaluation import (
    EvalContext,
    constant,
    make_apply,
    make_designator,
    make_higher_order,
    make_lazy_apply,
    make_member_test,
    now_supplier,
)
from pdp.policy_parser.reader import DocumentReader
from pdp.request import normalize_category
from pdp.urns import CURRENT_DATE, CURRENT_DATETIME, CURRENT_TIME, ENVIRONMENT

BOOLEAN = "http://www.w3.org/2001/XMLSchema#boolean"
# Equality functions whose Python `==` on parsed values is the XACML equality: a Match with one of
# them is a membership test, and the target index may use it.
ANY_OF = "urn:oasis:names:tc:xacml:3.0:function:any-of"
FAST_EQUAL_FUNCTIONS = {
    "urn:oasis:names:tc:xacml:1.0:function:string-equal",
    "urn:oasis:names:tc:xacml:1.0:function:anyURI-equal",
    "urn:oasis:names:tc:xacml:1.0:function:integer-equal",
    "urn:oasis:names:tc:xacml:1.0:function:boolean-equal",
}


@dataclass
class Typed:
    """A compiled expression and its static type (None: unknown), as checking a call needs it;
    a constant one also carries its value, a designator its attribute key."""

    ev: Callable[[EvalContext], Any]
    datatype: str | None
    is_bag: bool
    is_const: bool = False
    value: Any = None
    # (category, attribute_id, datatype) of a designator
    designator_key: tuple[str, str, str] | None = None
    must_be_present: bool = False
    issuer: str | None = None


class _DummyContext(EvalContext):
    """The empty request a constant expression is folded in."""

    def __init__(self) -> None:
        super().__init__({}, {})


def is_clock_attribute(key: tuple[str, ...]) -> bool:
    """Whether a designator reads the environment's clock (current-time, -date, -dateTime)."""
    return key[0] == ENVIRONMENT and key[1] in (CURRENT_TIME, CURRENT_DATE, CURRENT_DATETIME)


class ExpressionCompiler:
    """Compiles expressions into evaluator callables with their static type, reading and
    failing through the document's `DocumentReader`."""

    def __init__(self, reader: DocumentReader) -> None:
        self.reader = reader

    def attribute_value(self, elem: etree._Element) -> Typed:
        dt_id = self.reader.required(elem, "DataType")
        dt = self.reader.datatype(dt_id, elem)
        if any(isinstance(c.tag, str) for c in elem):
            raise self.reader.fail("structured AttributeValue content is not supported", elem)
        try:
            value = dt.parse(elem.text or "")
        except ValueSyntaxError as exc:
            raise self.reader.fail(str(exc), elem) from None
        return Typed(constant(value), dt.id, False, True, value)

    def designator(self, elem: etree._Element) -> Typed:
        category = self.reader.required(elem, "Category")
        attr_id = self.reader.required(elem, "AttributeId")
        dt_id = self.reader.required(elem, "DataType")
        dt = self.reader.datatype(dt_id, elem)
        mbp_raw = (elem.get("MustBePresent") or "").strip()
        if mbp_raw not in ("true", "false", "1", "0"):
            raise self.reader.fail(
                "AttributeDesignator needs MustBePresent=\"true\" or \"false\"", elem)
        mbp = mbp_raw in ("true", "1")
        issuer = elem.get("Issuer")
        category = normalize_category(category)
        canonical = canonical_datatype_id(dt.id)
        key = (category, attr_id, canonical)
        now = None
        if is_clock_attribute(key):
            now = now_supplier(attr_id)
        ev = make_designator(category, attr_id, canonical, issuer, mbp, now)
        return Typed(ev, dt.id, True, designator_key=key, must_be_present=mbp, issuer=issuer)

    def expression(self, elem: etree._Element, scope: VariableScope | None) -> Typed:
        name = self.reader.local(elem)
        if name == "AttributeValue":
            return self.attribute_value(elem)
        if name == "AttributeDesignator":
            return self.designator(elem)
        if name == "Apply":
            return self.apply(elem, scope)
        if name == "VariableReference":
            vid = self.reader.required(elem, "VariableId")
            if scope is None:
                raise self.reader.fail(f"VariableReference {vid} outside a <Policy>", elem)
            return scope.get(vid, elem)
        if name == "AttributeSelector":
            raise self.reader.fail("AttributeSelector (XPath) is not supported by this PDP", elem)
        if name == "Function":
            raise self.reader.fail("<Function> is only allowed as the first argument of a "
                            "higher-order function", elem)
        raise self.reader.fail(f"<{name}> is not an expression", elem)

    def apply(self, elem: etree._Element, scope: VariableScope | None) -> Typed:
        fid = self.reader.required(elem, "FunctionId")
        func = self.reader.function(fid, elem)
        arg_elems = [c for c in elem
                     if isinstance(c.tag, str) and self.reader.local(c) != "Description"]
        inner = None
        if func.higher_order:
            if not arg_elems or self.reader.local(arg_elems[0]) != "Function":
                raise self.reader.fail(f"{fid} needs a <Function> as its first argument", elem)
            inner = self.reader.function(self.reader.required(arg_elems[0], "FunctionId"),
                                         arg_elems[0])
            arg_elems = arg_elems[1:]
        args = [self.expression(a, scope) for a in arg_elems]
        self.reader.check_signature(func, [(a.datatype, a.is_bag) for a in args], elem, inner)
        if inner is not None:  # a higher-order function (set above exactly then)
            rtype, rbag = func.result_type(inner)
            if (fid == ANY_OF and inner.id in FAST_EQUAL_FUNCTIONS
                    and len(args) == 2 and args[0].is_const and not args[0].is_bag
                    and args[1].is_bag and args[0].datatype == args[1].datatype):
                # any-of(equal, literal, bag): a membership test (the common policy idiom).
                ev = make_member_test(args[0].value, args[1].ev)
            else:
                ev = make_higher_order(func.impl, inner, [a.ev for a in args])
        else:
            rtype, rbag = func.return_type, func.returns_bag
            if func.lazy:
                ev = make_lazy_apply(func.impl, [a.ev for a in args])
            else:
                ev = make_apply(func.impl, [a.ev for a in args])
        if all(a.is_const for a in args):
            # Constant folding: evaluate once now; an expression that always fails is an error.
            try:
                value = ev(_DummyContext())
            except Indeterminate as exc:
                raise self.reader.fail(f"expression always fails: {exc.message}", elem) from None
            except Exception as exc:  # noqa: BLE001 - a library bug must still end as a clear load error
                raise self.reader.fail(
                    f"expression cannot be evaluated: {type(exc).__name__}: {exc}", elem) from None
            return Typed(constant(value), rtype, rbag, True, value)
        return Typed(ev, rtype, rbag)


class VariableScope:
    """VariableDefinitions of one Policy, compiled on first use (cycles detected)."""

    def __init__(self, compiler: ExpressionCompiler, elems: dict[str, etree._Element]) -> None:
        self.compiler = compiler
        self.elems = elems
        self.done: dict[str, Typed] = {}
        self.in_progress: list[str] = []

    def get(self, vid: str, ref_elem: etree._Element) -> Typed:
        if vid in self.done:
            return self.done[vid]
        if vid not in self.elems:
            raise self.compiler.reader.fail(f"VariableReference to undefined variable {vid}",
                                            ref_elem)
        if vid in self.in_progress:
            cycle = " -> ".join(self.in_progress[self.in_progress.index(vid):] + [vid])
            raise self.compiler.reader.fail(f"circular VariableReference: {cycle}", ref_elem)
        self.in_progress.append(vid)
        elem = self.elems[vid]
        exprs = [c for c in elem if isinstance(c.tag, str)]
        if len(exprs) != 1:
            raise self.compiler.reader.fail(
                "<VariableDefinition> must contain exactly one expression", elem)
        typed = self.compiler.expression(exprs[0], self)
        self.in_progress.pop()
        self.done[vid] = typed
        return typed
