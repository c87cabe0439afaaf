"""The PolicyEngine facade: building, references, changes, traces, responses."""
from __future__ import annotations

import json

import pytest

from pdp.engine import PolicyEngine, PolicySource, inspect_policy
from pdp.errors import PolicyLoadError
from pdp.request import parse_request
from pdp.response import render_response
from pdp.results import STATUS_MISSING_ATTRIBUTE, Decision, PolicyIdentifier

from ._gen import INT, NS, RES, RID, SID, SUBJ, S, match, request_xml, simple_policy

XML = "application/xacml+xml"
RULE = "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:"
POL = "urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:"


def policy(pid: str, body: str, target: str = "", version: str = "1.0",
           alg: str = "deny-overrides") -> bytes:
    return (f'<Policy xmlns="{NS}" PolicyId="{pid}" Version="{version}" '
            f'RuleCombiningAlgId="{RULE}{alg}"><Target>{target}</Target>{body}</Policy>').encode()


def policy_set(psid: str, body: str, target: str = "", alg: str = "deny-overrides") -> bytes:
    return (f'<PolicySet xmlns="{NS}" PolicySetId="{psid}" Version="1.0" '
            f'PolicyCombiningAlgId="{POL}{alg}"><Target>{target}</Target>{body}</PolicySet>').encode()


def rule(rid: str, effect: str, extra: str = "") -> str:
    return f'<Rule RuleId="{rid}" Effect="{effect}">{extra}</Rule>'


def req(resource: str = "doc", action: str = "read", level: int | None = 5, rpil: bool = False):
    body = request_xml("alice", resource, action, level)
    if rpil:
        body = body.replace(b'ReturnPolicyIdList="false"', b'ReturnPolicyIdList="true"')
    return parse_request(body, XML)


def decide(sources, request=None, **kw):
    engine = PolicyEngine.compile([PolicySource(f"s{i}", s) for i, s in enumerate(sources)], **kw)
    return engine.decide(request or req()).results[0]


def test_inspect_policy_reports_id_version_kind():
    info = inspect_policy(PolicySource("file.xml", policy("p", "", version="2.1")))
    assert (info.id, info.version, info.is_policy_set, info.source) == ("p", "2.1", False,
                                                                         "file.xml")


def test_compile_is_all_or_nothing_and_says_where():
    good = policy("good", rule("r", "Permit"))
    bad = policy("bad", rule("r", "Maybe"))
    with pytest.raises(PolicyLoadError) as info:
        PolicyEngine.compile([PolicySource("good.xml", good), PolicySource("bad.xml", bad)])
    assert info.value.source == "bad.xml" and info.value.element == "Rule"
    assert info.value.line == 1


@pytest.mark.parametrize("body,message", [
    (rule("r", "Permit", f'<Condition><AttributeSelector Category="{RES}" Path="/a" '
                         f'DataType="{S}" MustBePresent="false"/></Condition>'),
     "AttributeSelector"),
    (rule("r", "Permit", '<Condition><Apply FunctionId="urn:no-such-function"/></Condition>'),
     "unknown function"),
    (rule("r", "Permit",
          f'<Condition><AttributeValue DataType="{INT}">x</AttributeValue></Condition>'),
     "invalid"),
    (rule("r", "Permit", '<Condition><VariableReference VariableId="v"/></Condition>'),
     "undefined variable"),
])
def test_invalid_policies(body, message):
    with pytest.raises(PolicyLoadError, match=message):
        inspect_policy(PolicySource("x", policy("p", body)))


def test_unknown_algorithm_is_refused():
    with pytest.raises(PolicyLoadError, match="rule-combining"):
        inspect_policy(PolicySource("x", policy("p", "", alg="whatever")))
    with pytest.raises(PolicyLoadError, match="root policy-combining"):
        PolicyEngine.compile([], "whatever")


def test_root_algorithm_short_names():
    docs = [policy("a", rule("r", "Permit")), policy("b", rule("r", "Deny"))]
    assert decide(docs, root_combining_alg="first-applicable").decision is Decision.PERMIT
    assert decide(docs, root_combining_alg="permit-overrides").decision is Decision.PERMIT
    assert decide(docs).decision is Decision.DENY
    assert decide([], root_combining_alg="deny-unless-permit").decision is Decision.DENY


def test_references_resolve_to_latest_matching_version():
    v1 = policy("shared", rule("r", "Permit"), version="1.0")
    v2 = policy("shared", rule("r", "Deny"), version="1.5")
    v3 = policy("shared", rule("r", "Permit"), version="2.0")
    root = policy_set("root", '<PolicyIdReference Version="1.*">shared</PolicyIdReference>')
    assert decide([root, v1, v2, v3], root_policy_id="root").decision is Decision.DENY
    root2 = policy_set("root", '<PolicyIdReference LatestVersion="1.2">shared</PolicyIdReference>')
    assert decide([root2, v1, v2, v3], root_policy_id="root").decision is Decision.PERMIT
    root3 = policy_set("root", '<PolicyIdReference Version="3.+">shared</PolicyIdReference>')
    with pytest.raises(PolicyLoadError, match="undefined reference"):
        PolicyEngine.compile([PolicySource("r", root3), PolicySource("v1", v1)])


def test_root_policy_id_must_exist():
    with pytest.raises(PolicyLoadError, match="root policy"):
        PolicyEngine.compile([PolicySource("a", policy("a", ""))], root_policy_id="zzz")


def test_with_changes_reuses_compiled_documents_and_relinks_references():
    leaf = policy("leaf", rule("r", "Permit"))
    root = policy_set("root", "<PolicyIdReference>leaf</PolicyIdReference>")
    other = policy(
        "other", rule("r", "Permit"), target=f"<AnyOf><AllOf>{match('x', RES, RID)}</AllOf></AnyOf>"
    )
    e1 = PolicyEngine.compile([PolicySource("root", root), PolicySource("leaf", leaf),
                               PolicySource("other", other)], root_policy_id="root")
    assert e1.decide(req()).results[0].decision is Decision.PERMIT
    e2 = e1.with_changes(upsert=[PolicySource("leaf", policy("leaf", rule("r", "Deny")))])
    assert e2.decide(req()).results[0].decision is Decision.DENY
    assert e1.decide(req()).results[0].decision is Decision.PERMIT  # old generation unchanged
    assert e2._entries[0].compiled is e1._entries[0].compiled
    assert set(e2.policies) == {"root", "leaf", "other"}
    with pytest.raises(PolicyLoadError, match="undefined reference"):
        e1.with_changes(remove_ids=["leaf"])
    e3 = e1.with_changes(remove_ids=["other"])
    assert set(e3.policies) == {"root", "leaf"}


def test_trace_and_policy_identifiers_include_referenced_documents():
    leaf = policy("leaf", rule("r", "Permit"))
    root = policy_set("root", "<PolicyIdReference>leaf</PolicyIdReference>" +
                      policy("inner", rule("r", "Deny"),
                             target=f"<AnyOf><AllOf>{match('nope', RES, RID)}</AllOf></AnyOf>")
                      .decode().replace(f' xmlns="{NS}"', ""))
    unrelated = policy("unrelated", rule("r", "Permit"),
                       target=f"<AnyOf><AllOf>{match('nope', RES, RID)}</AllOf></AnyOf>")
    engine = PolicyEngine.compile([PolicySource("a", root), PolicySource("b", leaf),
                                   PolicySource("c", unrelated)])
    response, traces = engine.decide_with_trace(req(rpil=True))
    result = response.results[0]
    assert result.decision is Decision.PERMIT
    assert traces == [{"root", "leaf"}]
    assert result.policy_identifiers == (PolicyIdentifier("root", "1.0", True),
                                         PolicyIdentifier("leaf", "1.0", False))
    assert engine.decide(req()).results[0].policy_identifiers is None
    assert "leaf" in engine.dependencies(req())
    xml = render_response(response, XML)
    assert b"<PolicySetIdReference Version=\"1.0\">root</PolicySetIdReference>" in xml
    js = json.loads(render_response(response, "application/xacml+json"))
    assert js["Response"][0]["PolicyIdentifierList"]["PolicyIdReference"] == [
        {"Id": "leaf", "Version": "1.0"}]


def test_indeterminate_target_weakens_to_extended_indeterminate():
    missing = f"<AnyOf><AllOf>{match('x', SUBJ, 'urn:absent', mbp=True)}</AllOf></AnyOf>"
    permit_behind_error = policy("a", rule("r", "Permit"), target=missing)
    deny_behind_error = policy("b", rule("r", "Deny"), target=missing)
    plain_permit = policy("c", rule("r", "Permit"))
    # Indeterminate{P} + Permit under deny-overrides is Permit ...
    assert decide([permit_behind_error, plain_permit]).decision is Decision.PERMIT
    # ... but Indeterminate{D} + Permit is Indeterminate{DP}, reported with missing-attribute.
    result = decide([deny_behind_error, plain_permit])
    assert result.decision is Decision.INDETERMINATE
    assert result.status.code == STATUS_MISSING_ATTRIBUTE
    assert result.status.missing_attributes[0].attribute_id == "urn:absent"
    xml = render_response(__import__("pdp.results", fromlist=["Response"]).Response((result,)), XML)
    assert b"MissingAttributeDetail" in xml and b"urn:absent" in xml


def test_bag_assignment_gives_one_assignment_per_value_and_fulfill_on_is_respected():
    ob = (f'<ObligationExpressions>'
          f'<ObligationExpression ObligationId="on-permit" FulfillOn="Permit">'
          f'<AttributeAssignmentExpression AttributeId="who"><Apply FunctionId='
          f'"urn:oasis:names:tc:xacml:1.0:function:string-bag"><AttributeValue DataType="{S}">a'
          f'</AttributeValue><AttributeValue DataType="{S}">b</AttributeValue></Apply>'
          f'</AttributeAssignmentExpression></ObligationExpression>'
          f'<ObligationExpression ObligationId="on-deny" FulfillOn="Deny"/>'
          f'</ObligationExpressions><AdviceExpressions><AdviceExpression AdviceId="adv" '
          f'AppliesTo="Permit"/></AdviceExpressions>')
    result = decide([policy("p", rule("r", "Permit") + ob)])
    assert [o.id for o in result.obligations] == ["on-permit"]
    assert [a.value for a in result.obligations[0].assignments] == ["a", "b"]
    assert [a.id for a in result.advice] == ["adv"]


def test_failing_obligation_makes_the_decision_indeterminate():
    ob = (f'<ObligationExpressions><ObligationExpression ObligationId="o" FulfillOn="Permit">'
          f'<AttributeAssignmentExpression AttributeId="x"><AttributeDesignator Category="{SUBJ}"'
          f' AttributeId="urn:absent" DataType="{S}" MustBePresent="true"/>'
          f'</AttributeAssignmentExpression></ObligationExpression></ObligationExpressions>')
    result = decide([policy("p", rule("r", "Permit", ob))])
    assert result.decision is Decision.INDETERMINATE
    assert result.status.code == STATUS_MISSING_ATTRIBUTE


def test_current_time_is_supplied_when_absent():
    cond = (
        '<Condition><Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:date-greater-than">'
        '<Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:date-one-and-only">'
        '<AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:'
        'environment" AttributeId="urn:oasis:names:tc:xacml:1.0:environment:current-date" '
        'DataType="http://www.w3.org/2001/XMLSchema#date" MustBePresent="true"/></Apply>'
        '<AttributeValue DataType="http://www.w3.org/2001/XMLSchema#date">2020-01-01'
        '</AttributeValue></Apply></Condition>'
    )
    assert decide([policy("p", rule("r", "Permit", cond))]).decision is Decision.PERMIT


def test_decide_bytes_turns_bad_requests_into_syntax_errors():
    engine = PolicyEngine.compile([PolicySource("p", simple_policy(1, "doc", "read"))])
    result = engine.decide_bytes(b"<Request xmlns='x'/>", XML).results[0]
    assert result.decision is Decision.INDETERMINATE
    assert "Request" in result.status.message
    ok = engine.decide_bytes(request_xml("alice", "doc", "read", 5), XML).results[0]
    assert ok.decision is Decision.PERMIT


def test_reference_chains_are_bounded():
    def chain(n):
        docs = [PolicySource("leaf", policy("p0", rule("r", "Permit")))]
        docs.append(
            PolicySource("s1", policy_set("s1", "<PolicyIdReference>p0</PolicyIdReference>"))
        )
        for i in range(2, n + 1):
            docs.append(PolicySource(f"s{i}", policy_set(
                f"s{i}", f"<PolicySetIdReference>s{i - 1}</PolicySetIdReference>")))
        return docs
    engine = PolicyEngine.compile(chain(20), root_policy_id="s20")
    assert engine.decide(req()).results[0].decision is Decision.PERMIT
    with pytest.raises(PolicyLoadError, match="nest more than"):
        PolicyEngine.compile(chain(40))


@pytest.mark.parametrize("role,expected", [("admin", Decision.PERMIT),
                                           ("guest", Decision.NOT_APPLICABLE)])
def test_any_of_membership_fast_path_agrees_with_the_generic_function(role, expected):
    F1 = "urn:oasis:names:tc:xacml:1.0:function:"
    F3 = "urn:oasis:names:tc:xacml:3.0:function:"
    bag = (f'<AttributeDesignator Category="{SUBJ}" AttributeId="{SID}" DataType="{S}" '
           f'MustBePresent="false"/>')
    lit = f'<AttributeValue DataType="{S}">{role}</AttributeValue>'
    fast = (f'<Condition><Apply FunctionId="{F3}any-of"><Function FunctionId="{F1}string-equal"/>'
            f'{lit}{bag}</Apply></Condition>')
    generic = (f'<Condition><Apply FunctionId="{F3}any-of"><Function FunctionId='
               f'"{F1}string-equal"/>{bag}{lit}</Apply></Condition>')
    request = parse_request(request_xml("admin", "doc", "read", 5), XML)
    for cond in (fast, generic):
        assert decide([policy("p", rule("r", "Permit", cond))], request).decision is expected


def test_concurrent_decisions_match_sequential_ones():
    from concurrent.futures import ThreadPoolExecutor
    docs = [PolicySource(f"p{i}", simple_policy(i, f"doc{i % 20}", ["read", "write"][i % 2],
                                                ["Permit", "Deny"][i % 3 == 0], i % 7))
            for i in range(60)]
    engine = PolicyEngine.compile(docs)
    bodies = [request_xml(f"u{k}", f"doc{k % 20}", ["read", "write"][k % 2], k % 9)
              for k in range(200)]
    sequential = [engine.decide_bytes(b, XML) for b in bodies]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda b: engine.decide_bytes(b, XML), bodies))
    assert parallel == sequential
    assert {r.results[0].decision for r in sequential} >= {Decision.PERMIT, Decision.DENY}
