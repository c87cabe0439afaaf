"""Runs the function-centred conformance tests (IIC*: one Policy, one Rule) through a tiny
test-only evaluator, so that every function's semantics is checked against the expected
decisions of the OASIS suite. The real evaluator lives elsewhere in `pdp/`; this one only
knows Apply, AttributeValue, AttributeDesignator, Function and simple Targets.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from pdp.datatypes import get_datatype
from pdp.errors import Indeterminate, ValueSyntaxError
from pdp.functions import get_function

SUITE = Path("/work/shared/conformance/xacml3/mandatory")
NS = "{urn:oasis:names:tc:xacml:3.0:core:schema:wd-17}"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                          huge_tree=False)


def _local(element) -> str:
    return etree.QName(element).localname


def _read_request(path: Path) -> dict:
    attrs: dict = {}
    root = etree.parse(str(path), _PARSER).getroot()
    for attributes in root.iter(NS + "Attributes"):
        category = attributes.get("Category")
        for attribute in attributes.iter(NS + "Attribute"):
            for value in attribute.iter(NS + "AttributeValue"):
                key = (category, attribute.get("AttributeId"), value.get("DataType"))
                attrs.setdefault(key, []).append((attribute.get("Issuer"), value.text or ""))
    return attrs


class MiniEvaluator:
    def __init__(self, request: dict) -> None:
        self.request = request

    def designator(self, element) -> tuple:
        key = (element.get("Category"), element.get("AttributeId"), element.get("DataType"))
        issuer = element.get("Issuer")
        datatype = get_datatype(element.get("DataType"))
        try:
            values = tuple(datatype.parse(text) for iss, text in self.request.get(key, [])
                           if issuer is None or iss == issuer)
        except ValueSyntaxError as exc:
            raise Indeterminate(str(exc)) from None
        if not values and element.get("MustBePresent") == "true":
            raise Indeterminate("missing attribute")
        return values

    def value(self, element):
        try:
            return get_datatype(element.get("DataType")).parse(element.text or "")
        except ValueSyntaxError as exc:
            raise Indeterminate(str(exc)) from None

    def expression(self, element):
        kind = _local(element)
        if kind == "AttributeValue":
            return self.value(element)
        if kind == "AttributeDesignator":
            return self.designator(element)
        if kind == "Apply":
            return self.apply(element)
        raise NotImplementedError(kind)

    def apply(self, element):
        function = get_function(element.get("FunctionId"))
        children = [c for c in element if isinstance(c.tag, str) and _local(c) != "Description"]
        if function.lazy:
            return function.impl(*(lambda c=c: self.expression(c) for c in children))
        if function.higher_order:
            inner = get_function(children[0].get("FunctionId"))
            return function.impl(inner, *(self.expression(c) for c in children[1:]))
        return function.impl(*(self.expression(c) for c in children))

    def target(self, target) -> bool:
        if target is None:
            return True
        for any_of in target.findall(NS + "AnyOf"):
            if not any(all(self.match(m) for m in all_of.findall(NS + "Match"))
                       for all_of in any_of.findall(NS + "AllOf")):
                return False
        return True

    def match(self, match) -> bool:
        function = get_function(match.get("MatchId"))
        literal = self.value(match.find(NS + "AttributeValue"))
        bag = self.designator(match.find(NS + "AttributeDesignator"))
        return any(function.impl(literal, v) for v in bag)

    def decide(self, policy) -> str:
        try:
            if not self.target(policy.find(NS + "Target")):
                return "NotApplicable"
            rule = policy.find(NS + "Rule")
            if not self.target(rule.find(NS + "Target")):
                return "NotApplicable"
            condition = rule.find(NS + "Condition")
            if condition is not None:
                result = self.expression(next(c for c in condition if isinstance(c.tag, str)))
                if result is not True:
                    return "NotApplicable"
            return rule.get("Effect")
        except Indeterminate:
            return "Indeterminate"


def _cases() -> list[Path]:
    if not SUITE.is_dir():
        return []
    return sorted(d for d in SUITE.glob("IIC*")
                  if (d / "Request.xml").is_file() and (d / "Policy.xml").is_file()
                  and b"xpath" not in (d / "Policy.xml").read_bytes().lower())


@pytest.mark.skipif(not SUITE.is_dir(), reason="conformance suite not available")
def test_function_conformance_cases():
    cases = _cases()
    assert len(cases) > 150
    failures = []
    for case in cases:
        policy = etree.parse(str(case / "Policy.xml"), _PARSER).getroot()
        expected = etree.parse(str(case / "Response.xml"), _PARSER).getroot() \
            .find(f"{NS}Result/{NS}Decision").text.strip()
        got = MiniEvaluator(_read_request(case / "Request.xml")).decide(policy)
        if got != expected:
            failures.append(f"{case.name}: expected {expected}, got {got}")
    assert failures == []
