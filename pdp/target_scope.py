"""Which resource-ids a compiled Policy or PolicySet can apply to (`PolicyEngine.resource_scope`).

The stream side uses it to re-decide, on a policy change, only the handles of the streams the
change can affect. The answer S must be sound: the document is NotApplicable to every request
none of whose resource-id values (category resource, data type string) is in S. When that
cannot be proven the answer is None ("any resource"), never a guess.

Proofs, on the compiled form (the same reasoning as `pdp.policy_scope`, XACML 3.0 section 7.7):

* A Target is the AND of its AnyOfs and is "No match" as soon as one AnyOf is, whatever the
  others give (`make_target` returns False there even after an Indeterminate AnyOf). An AnyOf
  in which every AllOf holds an equality Match of a string literal against the resource-id,
  without Issuer and with MustBePresent="false" (a `MatchSpec` on exactly that attribute key:
  a membership test that cannot fail), is "No match" for any request whose resource-ids are
  all outside the literals of those Matches. A Policy, PolicySet or Rule whose Target is
  "No match" is NotApplicable. Each such AnyOf is a proof on its own; the smallest is kept.
* A Policy or PolicySet whose combining algorithm answers NotApplicable when every child is
  NotApplicable (every standard algorithm but deny-unless-permit and permit-unless-deny, which
  answer Deny or Permit there) is NotApplicable outside the union of its children's scopes,
  whatever its own Target (an Indeterminate Target only weakens a decision that is not
  NotApplicable). Children are rules, nested policies and references, the latter resolved
  through the engine's link table (a reference that does not resolve gives None). One child
  without a scope makes this proof unavailable. No children at all: NotApplicable always, {}.

Anything else (another attribute, another data type, MustBePresent="true", an Issuer, another
function, an unknown combining algorithm) gives no proof.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pdp.combining import (
    deny_overrides,
    first_applicable,
    legacy_deny_overrides_policies,
    legacy_deny_overrides_rules,
    legacy_permit_overrides_policies,
    legacy_permit_overrides_rules,
    only_one_applicable,
    permit_overrides,
)
from pdp.evaluation import (
    AnyValue,
    Evaluable,
    Links,
    PolicyCombiner,
    PolicyEvaluator,
    ReferenceEvaluator,
    RuleEvaluator,
)
from pdp.notes import AttributeKey
from pdp.urns import RESOURCE as RESOURCE_CATEGORY, RESOURCE_ID, STRING

if TYPE_CHECKING:  # for annotations only
    from pdp.policy_parser.targets import TargetSpec

Scope = frozenset[str]  # resource-ids; None where a function gives `Scope | None`: any resource
ScopeMemo = dict[int, Scope | None]  # by id() of an evaluator, for one link table


# Combining algorithms whose answer is NotApplicable when every child is NotApplicable. A
# whitelist: an algorithm added later gives no proof until it is checked and listed here.
NOT_APPLICABLE_WHEN_ALL_ARE: frozenset[PolicyCombiner] = frozenset({
    deny_overrides, permit_overrides, first_applicable, only_one_applicable,
    legacy_deny_overrides_rules, legacy_permit_overrides_rules,
    legacy_deny_overrides_policies, legacy_permit_overrides_policies,
})

_resource_key: AttributeKey | None = None


def resource_key() -> AttributeKey:
    """The (category, attribute, data type) key the compiler gives a string resource-id."""
    global _resource_key
    if _resource_key is None:
        from pdp.datatypes import canonical_datatype_id
        from pdp.request import normalize_category

        _resource_key = (normalize_category(RESOURCE_CATEGORY), RESOURCE_ID,
                         canonical_datatype_id(STRING))
    return _resource_key


def target_scope(spec: TargetSpec | None) -> Scope | None:
    """The smallest resource-id set one AnyOf of this target spec confines requests to."""
    key = resource_key()
    best: Scope | None = None
    for any_of in spec or ():
        ids: set[str] = set()
        for all_of in any_of:
            literals: set[str] = {m.value for m in all_of
                        if m is not None and m.key == key and not m.must_be_present}
            if not literals:
                break
            ids |= literals
        else:
            if any_of and (best is None or len(ids) < len(best)):
                best = frozenset(ids)
    return best


def evaluator_scope(ev: Evaluable, links: Links, _memo: ScopeMemo | None = None
                    ) -> Scope | None:
    """The scope of a compiled rule, policy, policy set or reference (see the module docstring)."""
    memo: ScopeMemo = {} if _memo is None else _memo
    if id(ev) in memo:
        return memo[id(ev)]
    try:
        result = _scope(ev, links, memo)
    except RecursionError:  # absurdly deep nesting: no proof
        result = None
    memo[id(ev)] = result
    return result


def _scope(ev: Evaluable, links: Links, memo: ScopeMemo) -> Scope | None:
    if isinstance(ev, ReferenceEvaluator):
        target = links.get(ev.key)
        return None if target is None else evaluator_scope(target, links, memo)
    if isinstance(ev, RuleEvaluator):
        return target_scope(ev.target_spec)
    if not isinstance(ev, PolicyEvaluator):
        return None
    best = target_scope(ev.target_spec)
    if ev.combine in NOT_APPLICABLE_WHEN_ALL_ARE:
        union: set[str] = set()
        for child in ev.children:
            child_scope = evaluator_scope(child, links, memo)
            if child_scope is None:
                break
            union |= child_scope
        else:
            if best is None or len(union) < len(best):
                best = frozenset(union)
    return best


def attribute_key(category: str, attribute_id: str, datatype: str = STRING) -> AttributeKey:
    """The (category, attribute, data type) key the compiler gives a designator."""
    from pdp.datatypes import canonical_datatype_id
    from pdp.request import normalize_category

    return (normalize_category(category), attribute_id, canonical_datatype_id(datatype))


def target_literals(ev: Evaluable, links: Links, key: AttributeKey, _seen: set[int] | None = None
                    ) -> frozenset[AnyValue]:
    """Every literal that a target in this evaluator's tree (its own, its children's, and those
    its references reach) compares the attribute `key` with by an equality Match. Not a proof
    of anything: the values a policy names for an attribute (e.g. the action ids it grants or
    refuses), for callers that want to ask the PDP about each of them. Values tested only in a
    Condition, or by another function, are not found."""
    seen: set[int] = set() if _seen is None else _seen
    if id(ev) in seen:
        return frozenset()
    seen.add(id(ev))
    if isinstance(ev, ReferenceEvaluator):
        target = links.get(ev.key)
        return frozenset() if target is None else target_literals(target, links, key, seen)
    if not isinstance(ev, (RuleEvaluator, PolicyEvaluator)):
        return frozenset()
    found: set[AnyValue] = set()
    for any_of in ev.target_spec or ():
        for all_of in any_of:
            found.update(m.value for m in all_of if m is not None and m.key == key)
    if isinstance(ev, PolicyEvaluator):
        for child in ev.children:
            found |= target_literals(child, links, key, seen)
    return frozenset(found)


__all__ = ["target_scope", "evaluator_scope", "resource_key", "attribute_key", "target_literals",
           "RESOURCE_ID", "RESOURCE_CATEGORY"]
