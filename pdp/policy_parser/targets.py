"""Targets: AnyOf / AllOf / Match, compiled into matchers, with the MatchSpecs of the Matches the
target index can use (an equality of a literal and a designator without Issuer)."""
from __future__ import annotations

from lxml import etree

from pdp.evaluation import Matcher, make_all_of, make_any_of, make_match, make_target
from pdp.notes import MatchNote, TargetNote
from pdp.policy_parser.expressions import (
    BOOLEAN,
    FAST_EQUAL_FUNCTIONS,
    ExpressionCompiler,
    is_clock_attribute,
)
from pdp.policy_parser.model import MatchSpec
from pdp.policy_parser.reader import DocumentReader

TargetSpec = tuple[tuple[tuple[MatchSpec | None, ...], ...], ...]


class TargetCompiler:
    """Compiles a <Target> into its matcher and its index spec (its literals and designators
    through the `ExpressionCompiler`)."""

    def __init__(self, reader: DocumentReader, expressions: ExpressionCompiler) -> None:
        self.reader = reader
        self.expressions = expressions

    def target(self, elem: etree._Element) -> tuple[Matcher | None, TargetSpec, TargetNote]:
        """The target's matcher (None: matches every request), its index spec: per AnyOf,
        per AllOf, the MatchSpec of each Match (None where the index cannot use it), and its
        notes (`pdp.notes`: each Match on its own, for explanations and the linter)."""
        any_ofs = []
        spec = []
        notes = []
        for name, child in self.reader.children(elem):
            if name != "AnyOf":
                raise self.reader.fail(f"unexpected element <{name}> in <Target>", child)
            all_ofs = []
            any_spec = []
            any_notes = []
            for name2, child2 in self.reader.children(child):
                if name2 != "AllOf":
                    raise self.reader.fail(f"unexpected element <{name2}> in <AnyOf>", child2)
                matches = []
                all_spec = []
                all_notes = []
                for name3, child3 in self.reader.children(child2):
                    if name3 != "Match":
                        raise self.reader.fail(f"unexpected element <{name3}> in <AllOf>", child3)
                    m, ms, note = self.match(child3)
                    matches.append(m)
                    all_spec.append(ms)
                    all_notes.append(note)
                if not matches:
                    raise self.reader.fail("<AllOf> must contain at least one <Match>", child2)
                all_ofs.append(make_all_of(matches))
                any_spec.append(tuple(all_spec))
                any_notes.append(tuple(all_notes))
            if not all_ofs:
                raise self.reader.fail("<AnyOf> must contain at least one <AllOf>", child)
            any_ofs.append(make_any_of(all_ofs))
            spec.append(tuple(any_spec))
            notes.append(tuple(any_notes))
        return make_target(any_ofs), tuple(spec), tuple(notes)

    def match(self, elem: etree._Element) -> tuple[Matcher, MatchSpec | None, MatchNote]:
        fid = self.reader.required(elem, "MatchId")
        func = self.reader.function(fid, elem)
        literal = None
        bag = None
        text = ""
        for name, child in self.reader.children(elem):
            if name == "AttributeValue":
                literal = self.expressions.attribute_value(child)
                text = child.text or ""
            elif name == "AttributeDesignator":
                bag = self.expressions.designator(child)
            elif name == "AttributeSelector":
                raise self.reader.fail(
                    "AttributeSelector (XPath) is not supported by this PDP", child)
            else:
                raise self.reader.fail(f"unexpected element <{name}> in <Match>", child)
        if literal is None or bag is None:
            raise self.reader.fail(
                "<Match> needs an <AttributeValue> and an <AttributeDesignator>", elem)
        if func.higher_order or func.lazy or func.returns_bag or func.return_type != BOOLEAN:
            raise self.reader.fail(f"MatchId {fid} is not a boolean function of two values", elem)
        self.reader.check_signature(func, [(literal.datatype, False), (bag.datatype, False)], elem)
        fast = fid in FAST_EQUAL_FUNCTIONS and literal.datatype == bag.datatype
        matcher = make_match(func.impl, literal.value, bag.ev, fast)
        spec = None
        if (fast and bag.issuer is None and bag.designator_key is not None
                and not is_clock_attribute(bag.designator_key)):
            spec = MatchSpec(bag.designator_key, literal.value, bag.must_be_present)
        category, attribute_id, datatype = bag.designator_key or ("", "", "")
        note = MatchNote(matcher, fid, literal.value, text, category, attribute_id, datatype,
                         bag.issuer, bag.must_be_present, elem.sourceline)
        return matcher, spec, note
