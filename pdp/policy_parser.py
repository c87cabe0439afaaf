"""Parse and compile XACML 3.0 policy documents into evaluator objects, once, at load time.

Everything that can be checked without a request is checked here, so that a policy that loads
can only fail at decision time because of the request: unknown functions, datatypes and
combining algorithms, invalid literal values, static type errors in Apply/Match/Condition,
undefined or circular VariableReferences, duplicate Rule/Variable/Policy(Set) ids within a
document, and constant sub-expressions that always fail (they are folded here; a failing one
such as string-substring with a negative index is a load error).

AttributeSelector (XPath) is an optional XACML feature that this PDP does not implement: a policy
using it is refused at load with a message saying so. Policy(Set)IdReferences are compiled into
`ReferenceEvaluator`s and resolved by the engine (pdp.engine), which also detects cycles and
undefined references across documents.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from lxml import etree

from pdp.combining import POLICY_COMBINING, RULE_COMBINING
from pdp.errors import Indeterminate, PolicyLoadError, ValueSyntaxError
from pdp.evaluation import (DENY, PERMIT, AssignmentExpr, EvalContext, ObligationExpr,
                            PolicyEvaluator, ReferenceEvaluator, RuleEvaluator, constant,
                            make_all_of, make_any_of, make_apply, make_designator,
                            make_higher_order, make_lazy_apply, make_match, make_member_test,
                            make_target, now_supplier)
from pdp.results import PolicyIdentifier
from pdp.xmlsafe import UnsafeDocumentError, parse_xml
from pdp.urns import XACML_NS

_NS = "{%s}" % XACML_NS
BOOLEAN = "http://www.w3.org/2001/XMLSchema#boolean"
# Untrusted (issued) policies belong to the Administration and Delegation profile; treating them
# as trusted would be wrong, so they are refused rather than silently evaluated.
_NO_DELEGATION = ("PolicyIssuer (XACML Administration and Delegation profile) is not supported; "
                  "only trusted policies without PolicyIssuer can be loaded")

# Equality functions whose Python `==` on parsed values is the XACML equality: a Match with one of
# them is a membership test, and the target index may use it.
ANY_OF = "urn:oasis:names:tc:xacml:3.0:function:any-of"
FAST_EQUAL_FUNCTIONS = {
    "urn:oasis:names:tc:xacml:1.0:function:string-equal",
    "urn:oasis:names:tc:xacml:1.0:function:anyURI-equal",
    "urn:oasis:names:tc:xacml:1.0:function:integer-equal",
    "urn:oasis:names:tc:xacml:1.0:function:boolean-equal",
}


@dataclass(frozen=True)
class PolicySource:
    """A policy document and where it came from (file path or store id, for messages)."""

    name: str
    data: bytes


@dataclass(frozen=True)
class PolicyInfo:
    id: str
    version: str
    is_policy_set: bool
    source: str


@dataclass(frozen=True)
class RefSpec:
    """A Policy(Set)IdReference: what it asks for. Hashable: the engine's link-table key."""

    is_policy_set: bool
    id: str
    version: str | None = None
    earliest: str | None = None
    latest: str | None = None

    def describe(self) -> str:
        kind = "PolicySetIdReference" if self.is_policy_set else "PolicyIdReference"
        cons = ", ".join(f"{k}={v}" for k, v in (("Version", self.version),
                                                 ("EarliestVersion", self.earliest),
                                                 ("LatestVersion", self.latest)) if v)
        return f"{kind} {self.id}" + (f" ({cons})" if cons else "")

    def matches(self, version: str) -> bool:
        return version_matches(version, self.version, self.earliest, self.latest)


@dataclass(frozen=True)
class MatchSpec:
    """An indexable Match: literal value equal to some value of the attribute `key`."""

    key: tuple  # (category, attribute_id, datatype)
    value: Any
    must_be_present: bool


@dataclass
class CompiledDocument:
    info: PolicyInfo
    evaluator: PolicyEvaluator
    references: list[tuple[RefSpec, int | None]] = field(default_factory=list)


# ----------------------------------------------------------------------------- versions

# ASCII digits ([0-9], never \d, which takes every Unicode decimal digit), at most 18 to a
# number so that each fits a 64-bit integer, at most MAX_VERSION_TEXT characters in all
MAX_VERSION_TEXT = 255
_VERSION_RE = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,18})*")
_VERSION_PATTERN_RE = re.compile(r"(?:(?:[0-9]{1,18}|[*+])\.)*(?:[0-9]{1,18}|[*+])")


def is_version(text: str) -> bool:
    """A XACML VersionType: ASCII numbers of at most 18 digits joined by dots ('1', '2.0.1')."""
    return len(text) <= MAX_VERSION_TEXT and _VERSION_RE.fullmatch(text) is not None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _pattern_regex(pattern: str) -> re.Pattern:
    parts = []
    for token in pattern.split("."):
        if token == "*":
            parts.append(r"[0-9]+(?:\.[0-9]+)*")
        elif token == "+":
            parts.append(r"[0-9]+")
        else:
            parts.append(re.escape(token))
    return re.compile("^" + r"\.".join(parts) + "$")


def _bound(pattern: str, low: bool) -> tuple[int, ...]:
    # A wildcard in Earliest/LatestVersion makes that position unbounded.
    out = []
    for token in pattern.split("."):
        if token in ("*", "+"):
            out.append(-1 if low else 1 << 62)
            if token == "*":
                break
        else:
            out.append(int(token))
    return tuple(out)


def version_matches(version: str, exact: str | None, earliest: str | None,
                    latest: str | None) -> bool:
    """XACML 3.0 version matching (section 5.13: digits, '+' one number, '*' any suffix)."""
    if exact is not None and not _pattern_regex(exact).match(version):
        return False
    vt = _version_tuple(version)
    if earliest is not None and vt < _bound(earliest, True):
        return False
    if latest is not None and vt > _bound(latest, False):
        if "*" not in latest or not _pattern_regex(latest).match(version):
            return False
    return True


# ----------------------------------------------------------------------------- compiler


@dataclass
class _Typed:
    ev: Callable[[EvalContext], Any]
    datatype: str | None
    is_bag: bool
    is_const: bool = False
    value: Any = None
    designator_key: tuple | None = None  # (category, attribute_id, datatype) of a designator
    must_be_present: bool = False
    issuer: str | None = None


class _DummyContext(EvalContext):
    def __init__(self) -> None:
        super().__init__({}, {})


def _lib():
    import pdp.datatypes as datatypes
    import pdp.functions as functions
    return datatypes, functions


class _DocumentCompiler:
    def __init__(self, source: str) -> None:
        self.source = source
        self.datatypes, self.functions = _lib()
        self.signature_error: Callable[..., str | None] | None
        try:
            from pdp.functions.base import signature_error
            self.signature_error = signature_error
        except ImportError:  # pragma: no cover - library without the static checker
            self.signature_error = None
        self.references: list[tuple[RefSpec, int | None]] = []
        # Ids are unique within a document whatever their versions (the `others/` suite).
        self.policy_ids: set[str] = set()
        self.policyset_ids: set[str] = set()

    # -- helpers

    def fail(self, message: str, elem: etree._Element | None) -> PolicyLoadError:
        name = None if elem is None else etree.QName(elem).localname
        line = None if elem is None else elem.sourceline
        return PolicyLoadError(message, self.source, name, line)

    def local(self, elem: etree._Element) -> str:
        tag = elem.tag
        if not isinstance(tag, str):
            return ""
        if tag.startswith(_NS):
            return tag[len(_NS):]
        raise self.fail(f"element {tag} is not in the XACML 3.0 namespace {XACML_NS}", elem)

    def children(self, elem: etree._Element):
        for child in elem:
            name = self.local(child)
            if name:
                yield name, child

    def required(self, elem: etree._Element, attr: str) -> str:
        value = elem.get(attr)
        if value is None or not value.strip():
            raise self.fail(f"missing required attribute {attr}", elem)
        return value.strip()

    def datatype(self, dt_id: str, elem: etree._Element):
        try:
            return self.datatypes.get_datatype(dt_id)
        except KeyError:
            raise self.fail(f"unknown DataType {dt_id}", elem) from None

    def function(self, fid: str, elem: etree._Element):
        try:
            return self.functions.get_function(fid)
        except KeyError:
            raise self.fail(f"unknown function {fid}", elem) from None

    def check_signature(self, func, sigs, elem, inner=None) -> None:
        if self.signature_error is not None:
            err = self.signature_error(func, sigs, inner) if func.higher_order else \
                self.signature_error(func, sigs)
        else:  # pragma: no cover
            err = None
        if err:
            raise self.fail(f"type error in {func.id}: {err}", elem)

    # -- documents

    def compile_root(self, root: etree._Element) -> PolicyEvaluator:
        name = self.local(root)
        if name == "Policy":
            return self.policy(root)
        if name == "PolicySet":
            return self.policy_set(root)
        raise self.fail(f"root element must be <Policy> or <PolicySet>, not <{name}>", root)

    def _version(self, elem: etree._Element) -> str:
        version = (elem.get("Version") or "1.0").strip()
        if not is_version(version):
            raise self.fail(f"invalid Version {version!r}", elem)
        return version

    def policy_set(self, elem: etree._Element) -> PolicyEvaluator:
        ps_id = self.required(elem, "PolicySetId")
        version = self._version(elem)
        if ps_id in self.policyset_ids:
            raise self.fail(f"duplicate PolicySetId {ps_id} in the document", elem)
        self.policyset_ids.add(ps_id)
        alg_id = self.required(elem, "PolicyCombiningAlgId")
        combine = POLICY_COMBINING.get(alg_id)
        if combine is None:
            raise self.fail(f"unknown policy-combining algorithm {alg_id}", elem)
        target = None
        spec = None
        children: list[PolicyEvaluator | ReferenceEvaluator] = []
        obligations: list = []
        advice: list = []
        for name, child in self.children(elem):
            if name == "Target":
                target, spec = self.target(child)
            elif name == "Policy":
                children.append(self.policy(child))
            elif name == "PolicySet":
                children.append(self.policy_set(child))
            elif name in ("PolicyIdReference", "PolicySetIdReference"):
                children.append(self.reference(child, name == "PolicySetIdReference"))
            elif name == "ObligationExpressions":
                obligations = self.obligation_exprs(child, "ObligationExpression")
            elif name == "AdviceExpressions":
                advice = self.obligation_exprs(child, "AdviceExpression")
            elif name == "PolicyIssuer":
                raise self.fail(_NO_DELEGATION, child)
            elif name in ("Description", "PolicySetDefaults", "CombinerParameters",
                          "PolicyCombinerParameters", "PolicySetCombinerParameters"):
                continue
            else:
                raise self.fail(f"unexpected element <{name}> in <PolicySet>", child)
        ident = PolicyIdentifier(ps_id, version, True)
        ev = PolicyEvaluator(ident, target, combine, children, obligations, advice, spec)
        _attach_index(ev)
        return ev

    def reference(self, elem: etree._Element, is_set: bool) -> ReferenceEvaluator:
        ref_id = (elem.text or "").strip()
        if not ref_id:
            raise self.fail("empty policy reference", elem)
        spec = RefSpec(is_set, ref_id, elem.get("Version"), elem.get("EarliestVersion"),
                       elem.get("LatestVersion"))
        for pattern in (spec.version, spec.earliest, spec.latest):
            if pattern is not None and (len(pattern) > MAX_VERSION_TEXT
                                        or not _VERSION_PATTERN_RE.fullmatch(pattern)):
                raise self.fail(f"invalid version pattern {pattern!r}", elem)
        self.references.append((spec, elem.sourceline))
        return ReferenceEvaluator(spec, spec.describe())

    def policy(self, elem: etree._Element) -> PolicyEvaluator:
        p_id = self.required(elem, "PolicyId")
        version = self._version(elem)
        if p_id in self.policy_ids:
            raise self.fail(f"duplicate PolicyId {p_id} in the document", elem)
        self.policy_ids.add(p_id)
        alg_id = self.required(elem, "RuleCombiningAlgId")
        combine = RULE_COMBINING.get(alg_id)
        if combine is None:
            raise self.fail(f"unknown rule-combining algorithm {alg_id}", elem)
        # Variables first: a VariableReference may precede its definition.
        var_elems: dict[str, etree._Element] = {}
        for name, child in self.children(elem):
            if name == "VariableDefinition":
                vid = self.required(child, "VariableId")
                if vid in var_elems:
                    raise self.fail(f"duplicate VariableId {vid} in policy {p_id}", child)
                var_elems[vid] = child
        scope = _VariableScope(self, var_elems)
        for vid in var_elems:
            scope.get(vid, var_elems[vid])
        target = None
        spec = None
        rules = []
        rule_ids: set[str] = set()
        obligations: list = []
        advice: list = []
        for name, child in self.children(elem):
            if name == "Target":
                target, spec = self.target(child)
            elif name == "Rule":
                rule = self.rule(child, scope)
                if rule.id in rule_ids:
                    raise self.fail(f"duplicate RuleId {rule.id} in policy {p_id}", child)
                rule_ids.add(rule.id)
                rules.append(rule)
            elif name == "ObligationExpressions":
                obligations = self.obligation_exprs(child, "ObligationExpression", scope)
            elif name == "AdviceExpressions":
                advice = self.obligation_exprs(child, "AdviceExpression", scope)
            elif name == "PolicyIssuer":
                raise self.fail(_NO_DELEGATION, child)
            elif name in ("Description", "PolicyDefaults", "CombinerParameters",
                          "RuleCombinerParameters", "VariableDefinition"):
                continue
            else:
                raise self.fail(f"unexpected element <{name}> in <Policy>", child)
        ident = PolicyIdentifier(p_id, version, False)
        ev = PolicyEvaluator(ident, target, combine, rules, obligations, advice, spec)
        _attach_index(ev)
        return ev

    def rule(self, elem: etree._Element, scope: "_VariableScope") -> RuleEvaluator:
        rule_id = self.required(elem, "RuleId")
        effect_name = self.required(elem, "Effect")
        if effect_name not in ("Permit", "Deny"):
            raise self.fail(f"Effect must be Permit or Deny, not {effect_name!r}", elem)
        effect = PERMIT if effect_name == "Permit" else DENY
        target = None
        spec = None
        condition = None
        obligations: list = []
        advice: list = []
        for name, child in self.children(elem):
            if name == "Target":
                target, spec = self.target(child)
            elif name == "Condition":
                exprs = [c for c in child if isinstance(c.tag, str)]
                if len(exprs) != 1:
                    raise self.fail("<Condition> must contain exactly one expression", child)
                typed = self.expression(exprs[0], scope)
                if typed.is_bag or typed.datatype != BOOLEAN:
                    raise self.fail(f"<Condition> must be a boolean expression, not "
                                    f"{'a bag of ' if typed.is_bag else ''}{typed.datatype}", child)
                if typed.is_const:
                    value = typed.value
                    condition = None if value else (lambda ctx: False)
                else:
                    condition = typed.ev
            elif name == "ObligationExpressions":
                obligations = self.obligation_exprs(child, "ObligationExpression", scope)
            elif name == "AdviceExpressions":
                advice = self.obligation_exprs(child, "AdviceExpression", scope)
            elif name == "Description":
                continue
            else:
                raise self.fail(f"unexpected element <{name}> in <Rule>", child)
        return RuleEvaluator(rule_id, effect, target, condition, obligations, advice, spec)

    # -- targets

    def target(self, elem: etree._Element):
        any_ofs = []
        spec = []
        for name, child in self.children(elem):
            if name != "AnyOf":
                raise self.fail(f"unexpected element <{name}> in <Target>", child)
            all_ofs = []
            any_spec = []
            for name2, child2 in self.children(child):
                if name2 != "AllOf":
                    raise self.fail(f"unexpected element <{name2}> in <AnyOf>", child2)
                matches = []
                all_spec = []
                for name3, child3 in self.children(child2):
                    if name3 != "Match":
                        raise self.fail(f"unexpected element <{name3}> in <AllOf>", child3)
                    m, ms = self.match(child3)
                    matches.append(m)
                    all_spec.append(ms)
                if not matches:
                    raise self.fail("<AllOf> must contain at least one <Match>", child2)
                all_ofs.append(make_all_of(matches))
                any_spec.append(tuple(all_spec))
            if not all_ofs:
                raise self.fail("<AnyOf> must contain at least one <AllOf>", child)
            any_ofs.append(make_any_of(all_ofs))
            spec.append(tuple(any_spec))
        return make_target(any_ofs), tuple(spec)

    def match(self, elem: etree._Element):
        fid = self.required(elem, "MatchId")
        func = self.function(fid, elem)
        literal = None
        bag = None
        for name, child in self.children(elem):
            if name == "AttributeValue":
                literal = self.attribute_value(child)
            elif name == "AttributeDesignator":
                bag = self.designator(child)
            elif name == "AttributeSelector":
                raise self.fail("AttributeSelector (XPath) is not supported by this PDP", child)
            else:
                raise self.fail(f"unexpected element <{name}> in <Match>", child)
        if literal is None or bag is None:
            raise self.fail("<Match> needs an <AttributeValue> and an <AttributeDesignator>", elem)
        if func.higher_order or func.lazy or func.returns_bag or func.return_type != BOOLEAN:
            raise self.fail(f"MatchId {fid} is not a boolean function of two values", elem)
        self.check_signature(func, [(literal.datatype, False), (bag.datatype, False)], elem)
        fast = fid in FAST_EQUAL_FUNCTIONS and literal.datatype == bag.datatype
        matcher = make_match(func.impl, literal.value, bag.ev, fast)
        spec = None
        if (fast and bag.issuer is None and bag.designator_key is not None
                and not _is_clock_attribute(bag.designator_key)):
            spec = MatchSpec(bag.designator_key, literal.value, bag.must_be_present)
        return matcher, spec

    # -- expressions

    def attribute_value(self, elem: etree._Element) -> _Typed:
        dt_id = self.required(elem, "DataType")
        dt = self.datatype(dt_id, elem)
        if any(isinstance(c.tag, str) for c in elem):
            raise self.fail("structured AttributeValue content is not supported", elem)
        try:
            value = dt.parse(elem.text or "")
        except ValueSyntaxError as exc:
            raise self.fail(str(exc), elem) from None
        return _Typed(constant(value), dt.id, False, True, value)

    def designator(self, elem: etree._Element) -> _Typed:
        category = self.required(elem, "Category")
        attr_id = self.required(elem, "AttributeId")
        dt_id = self.required(elem, "DataType")
        dt = self.datatype(dt_id, elem)
        mbp_raw = (elem.get("MustBePresent") or "").strip()
        if mbp_raw not in ("true", "false", "1", "0"):
            raise self.fail("AttributeDesignator needs MustBePresent=\"true\" or \"false\"", elem)
        mbp = mbp_raw in ("true", "1")
        issuer = elem.get("Issuer")
        from pdp.request import normalize_category
        category = normalize_category(category)
        canonical = self.datatypes.canonical_datatype_id(dt.id)
        key = (category, attr_id, canonical)
        now = None
        if _is_clock_attribute(key):
            now = now_supplier(attr_id, self.datatypes)
        ev = make_designator(category, attr_id, canonical, issuer, mbp, now)
        return _Typed(ev, dt.id, True, designator_key=key, must_be_present=mbp, issuer=issuer)

    def expression(self, elem: etree._Element, scope: "_VariableScope | None") -> _Typed:
        name = self.local(elem)
        if name == "AttributeValue":
            return self.attribute_value(elem)
        if name == "AttributeDesignator":
            return self.designator(elem)
        if name == "Apply":
            return self.apply(elem, scope)
        if name == "VariableReference":
            vid = self.required(elem, "VariableId")
            if scope is None:
                raise self.fail(f"VariableReference {vid} outside a <Policy>", elem)
            return scope.get(vid, elem)
        if name == "AttributeSelector":
            raise self.fail("AttributeSelector (XPath) is not supported by this PDP", elem)
        if name == "Function":
            raise self.fail("<Function> is only allowed as the first argument of a "
                            "higher-order function", elem)
        raise self.fail(f"<{name}> is not an expression", elem)

    def apply(self, elem: etree._Element, scope: "_VariableScope | None") -> _Typed:
        fid = self.required(elem, "FunctionId")
        func = self.function(fid, elem)
        arg_elems = [c for c in elem if isinstance(c.tag, str) and self.local(c) != "Description"]
        inner = None
        if func.higher_order:
            if not arg_elems or self.local(arg_elems[0]) != "Function":
                raise self.fail(f"{fid} needs a <Function> as its first argument", elem)
            inner = self.function(self.required(arg_elems[0], "FunctionId"), arg_elems[0])
            arg_elems = arg_elems[1:]
        args = [self.expression(a, scope) for a in arg_elems]
        self.check_signature(func, [(a.datatype, a.is_bag) for a in args], elem, inner)
        if func.higher_order:
            rtype, rbag = func.result_type(inner)
            if (fid == ANY_OF and inner is not None and inner.id in FAST_EQUAL_FUNCTIONS and len(args) == 2
                    and args[0].is_const and not args[0].is_bag and args[1].is_bag
                    and args[0].datatype == args[1].datatype):
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
                raise self.fail(f"expression always fails: {exc.message}", elem) from None
            except Exception as exc:  # a library bug must still end as a clear load error
                raise self.fail(f"expression cannot be evaluated: {type(exc).__name__}: {exc}",
                                elem) from None
            return _Typed(constant(value), rtype, rbag, True, value)
        return _Typed(ev, rtype, rbag)

    # -- obligations and advice

    def obligation_exprs(self, elem: etree._Element, child_name: str,
                         scope: "_VariableScope | None" = None) -> list[ObligationExpr]:
        out = []
        is_ob = child_name == "ObligationExpression"
        id_attr = "ObligationId" if is_ob else "AdviceId"
        effect_attr = "FulfillOn" if is_ob else "AppliesTo"
        for name, child in self.children(elem):
            if name != child_name:
                raise self.fail(f"unexpected element <{name}> in <{etree.QName(elem).localname}>",
                                child)
            oid = self.required(child, id_attr)
            effect_name = self.required(child, effect_attr)
            if effect_name not in ("Permit", "Deny"):
                raise self.fail(f"{effect_attr} must be Permit or Deny", child)
            assignments = []
            for name2, aae in self.children(child):
                if name2 != "AttributeAssignmentExpression":
                    raise self.fail(f"unexpected element <{name2}> in <{child_name}>", aae)
                attr_id = self.required(aae, "AttributeId")
                exprs = [c for c in aae if isinstance(c.tag, str)]
                if len(exprs) != 1:
                    raise self.fail("<AttributeAssignmentExpression> must contain exactly one "
                                    "expression", aae)
                typed = self.expression(exprs[0], scope)
                if typed.datatype is None:
                    raise self.fail("cannot determine the datatype of the assignment", aae)
                fmt = self.datatype(typed.datatype, aae).format
                assignments.append(AssignmentExpr(attr_id, aae.get("Category"), aae.get("Issuer"),
                                                  typed.ev, typed.datatype, typed.is_bag, fmt))
            out.append(ObligationExpr(oid, PERMIT if effect_name == "Permit" else DENY,
                                      assignments))
        return out


class _VariableScope:
    """VariableDefinitions of one Policy, compiled on first use (cycles detected)."""

    def __init__(self, compiler: _DocumentCompiler, elems: dict[str, etree._Element]) -> None:
        self.compiler = compiler
        self.elems = elems
        self.done: dict[str, _Typed] = {}
        self.in_progress: list[str] = []

    def get(self, vid: str, ref_elem: etree._Element) -> _Typed:
        if vid in self.done:
            return self.done[vid]
        if vid not in self.elems:
            raise self.compiler.fail(f"VariableReference to undefined variable {vid}", ref_elem)
        if vid in self.in_progress:
            cycle = " -> ".join(self.in_progress[self.in_progress.index(vid):] + [vid])
            raise self.compiler.fail(f"circular VariableReference: {cycle}", ref_elem)
        self.in_progress.append(vid)
        elem = self.elems[vid]
        exprs = [c for c in elem if isinstance(c.tag, str)]
        if len(exprs) != 1:
            raise self.compiler.fail("<VariableDefinition> must contain exactly one expression",
                                     elem)
        typed = self.compiler.expression(exprs[0], self)
        self.in_progress.pop()
        self.done[vid] = typed
        return typed


def _is_clock_attribute(key: tuple) -> bool:
    from pdp.evaluation import CURRENT_DATE, CURRENT_DATETIME, CURRENT_TIME, ENVIRONMENT
    return key[0] == ENVIRONMENT and key[1] in (CURRENT_TIME, CURRENT_DATE, CURRENT_DATETIME)


def _attach_index(ev: PolicyEvaluator) -> None:
    from pdp.index import build_index
    ev.index = build_index(ev.children)


def compile_document(source: PolicySource, *, max_bytes: int | None = None,
                     max_depth: int | None = None) -> CompiledDocument:
    """Parse and compile one Policy or PolicySet document; raises PolicyLoadError."""
    try:
        root = parse_xml(source.data, max_bytes=max_bytes, max_depth=max_depth)
    except UnsafeDocumentError as exc:
        raise PolicyLoadError(exc.message, source.name, None, exc.line) from None
    compiler = _DocumentCompiler(source.name)
    try:
        evaluator = compiler.compile_root(root)
    except RecursionError:
        raise PolicyLoadError("policy nests too deeply", source.name) from None
    except PolicyLoadError:
        raise
    except Exception as exc:  # never let a policy crash the loader with a bare exception
        raise PolicyLoadError(f"cannot compile the policy: {type(exc).__name__}: {exc}",
                              source.name) from None
    evaluator.doc_id = evaluator.identifier.id
    ident = evaluator.identifier
    info = PolicyInfo(ident.id, ident.version, ident.is_policy_set, source.name)
    return CompiledDocument(info, evaluator, compiler.references)
