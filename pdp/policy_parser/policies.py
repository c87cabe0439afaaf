"""Policies and rules: a <Policy> with its VariableDefinitions, rules, combining algorithm and
obligation and advice expressions, each Rule with its effect, target and condition."""
from __future__ import annotations

from lxml import etree

from pdp.combining import RULE_COMBINING
from pdp.evaluation import (
    DENY,
    PERMIT,
    AnyPolicy,
    AssignmentExpr,
    ObligationExpr,
    Policy,
    PolicyEvaluator,
    RuleEvaluator,
)
from pdp.index import build_index
from pdp.notes import (
    ALWAYS_FALSE,
    COMPUTED,
    NO_CONDITION,
    DesignatorNote,
    Notes,
    TargetNote,
    designators_in,
)
from pdp.policy_parser.expressions import BOOLEAN, ExpressionCompiler, VariableScope
from pdp.policy_parser.reader import NO_DELEGATION, DocumentReader
from pdp.policy_parser.targets import TargetCompiler
from pdp.results import PolicyIdentifier


def attach_index(ev: AnyPolicy) -> None:
    """Gives a policy or policy set the index of its children's targets."""
    ev.index = build_index(ev.children)


class PolicyCompiler:
    """Compiles a <Policy>, its rules, and obligation and advice expressions, from the
    document's reader and the compilers of expressions and targets it is given."""

    def __init__(self, reader: DocumentReader, expressions: ExpressionCompiler,
                 targets: TargetCompiler) -> None:
        self.reader = reader
        self.expressions = expressions
        self.targets = targets

    def policy(self, elem: etree._Element) -> Policy:
        p_id = self.reader.required(elem, "PolicyId")
        version = self.reader.version(elem)
        if p_id in self.reader.policy_ids:
            raise self.reader.fail(f"duplicate PolicyId {p_id} in the document", elem)
        self.reader.policy_ids.add(p_id)
        alg_id = self.reader.required(elem, "RuleCombiningAlgId")
        combine = RULE_COMBINING.get(alg_id)
        if combine is None:
            raise self.reader.fail(f"unknown rule-combining algorithm {alg_id}", elem)
        # Variables first: a VariableReference may precede its definition.
        var_elems: dict[str, etree._Element] = {}
        for name, child in self.reader.children(elem):
            if name == "VariableDefinition":
                vid = self.reader.required(child, "VariableId")
                if vid in var_elems:
                    raise self.reader.fail(f"duplicate VariableId {vid} in policy {p_id}", child)
                var_elems[vid] = child
        scope = VariableScope(self.expressions, var_elems)
        for vid in var_elems:
            scope.get(vid, var_elems[vid])
        target = None
        spec = None
        target_note: TargetNote = ()
        rules = []
        rule_ids: set[str] = set()
        obligations: list[ObligationExpr] = []
        advice: list[ObligationExpr] = []
        for name, child in self.reader.children(elem):
            if name == "Target":
                target, spec, target_note = self.targets.target(child)
            elif name == "Rule":
                rule = self.rule(child, scope)
                if rule.id in rule_ids:
                    raise self.reader.fail(f"duplicate RuleId {rule.id} in policy {p_id}", child)
                rule_ids.add(rule.id)
                rules.append(rule)
            elif name == "ObligationExpressions":
                obligations = self.obligation_exprs(child, "ObligationExpression", scope)
            elif name == "AdviceExpressions":
                advice = self.obligation_exprs(child, "AdviceExpression", scope)
            elif name == "PolicyIssuer":
                raise self.reader.fail(NO_DELEGATION, child)
            elif name in ("Description", "PolicyDefaults", "CombinerParameters",
                          "RuleCombinerParameters", "VariableDefinition"):
                continue
            else:
                raise self.reader.fail(f"unexpected element <{name}> in <Policy>", child)
        ident = PolicyIdentifier(p_id, version, False)
        ev: Policy = PolicyEvaluator(ident, target, combine, rules, obligations, advice, spec,
                                     notes=Notes(elem.sourceline, target_note, algorithm=alg_id))
        attach_index(ev)
        return ev

    def rule(self, elem: etree._Element, scope: VariableScope) -> RuleEvaluator:
        rule_id = self.reader.required(elem, "RuleId")
        effect_name = self.reader.required(elem, "Effect")
        if effect_name not in ("Permit", "Deny"):
            raise self.reader.fail(f"Effect must be Permit or Deny, not {effect_name!r}", elem)
        effect = PERMIT if effect_name == "Permit" else DENY
        target = None
        spec = None
        target_note: TargetNote = ()
        condition = None
        condition_kind = NO_CONDITION
        reads: tuple[DesignatorNote, ...] = ()
        obligations: list[ObligationExpr] = []
        advice: list[ObligationExpr] = []
        for name, child in self.reader.children(elem):
            if name == "Target":
                target, spec, target_note = self.targets.target(child)
            elif name == "Condition":
                exprs = [c for c in child if isinstance(c.tag, str)]
                if len(exprs) != 1:
                    raise self.reader.fail("<Condition> must contain exactly one expression", child)
                typed = self.expressions.expression(exprs[0], scope)
                if typed.is_bag or typed.datatype != BOOLEAN:
                    raise self.reader.fail(f"<Condition> must be a boolean expression, not "
                                    f"{'a bag of ' if typed.is_bag else ''}{typed.datatype}", child)
                if typed.is_const:
                    value = typed.value
                    condition = None if value else (lambda ctx: False)
                    condition_kind = NO_CONDITION if value else ALWAYS_FALSE
                else:
                    condition = typed.ev
                    condition_kind = COMPUTED
                reads = designators_in(child, scope.elems)
            elif name == "ObligationExpressions":
                obligations = self.obligation_exprs(child, "ObligationExpression", scope)
            elif name == "AdviceExpressions":
                advice = self.obligation_exprs(child, "AdviceExpression", scope)
            elif name == "Description":
                continue
            else:
                raise self.reader.fail(f"unexpected element <{name}> in <Rule>", child)
        return RuleEvaluator(rule_id, effect, target, condition, obligations, advice, spec,
                             Notes(elem.sourceline, target_note, condition_kind, reads))

    def obligation_exprs(self, elem: etree._Element, child_name: str,
                         scope: VariableScope | None = None) -> list[ObligationExpr]:
        """The ObligationExpressions or AdviceExpressions (`child_name`) of an element."""
        out = []
        is_ob = child_name == "ObligationExpression"
        id_attr = "ObligationId" if is_ob else "AdviceId"
        effect_attr = "FulfillOn" if is_ob else "AppliesTo"
        for name, child in self.reader.children(elem):
            if name != child_name:
                raise self.reader.fail(
                    f"unexpected element <{name}> in <{etree.QName(elem).localname}>", child)
            oid = self.reader.required(child, id_attr)
            effect_name = self.reader.required(child, effect_attr)
            if effect_name not in ("Permit", "Deny"):
                raise self.reader.fail(f"{effect_attr} must be Permit or Deny", child)
            assignments = []
            for name2, aae in self.reader.children(child):
                if name2 != "AttributeAssignmentExpression":
                    raise self.reader.fail(f"unexpected element <{name2}> in <{child_name}>", aae)
                attr_id = self.reader.required(aae, "AttributeId")
                exprs = [c for c in aae if isinstance(c.tag, str)]
                if len(exprs) != 1:
                    raise self.reader.fail(
                        "<AttributeAssignmentExpression> must contain exactly one expression",
                        aae)
                typed = self.expressions.expression(exprs[0], scope)
                if typed.datatype is None:
                    raise self.reader.fail("cannot determine the datatype of the assignment", aae)
                fmt = self.reader.datatype(typed.datatype, aae).format
                assignments.append(AssignmentExpr(attr_id, aae.get("Category"), aae.get("Issuer"),
                                                  typed.ev, typed.datatype, typed.is_bag, fmt))
            out.append(ObligationExpr(oid, PERMIT if effect_name == "Permit" else DENY,
                                      assignments))
        return out

