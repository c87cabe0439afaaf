"""The linter of policy sets (`pep.core.lint`): each class of problem found in a crafted set,
with where and why; nothing found in the example policies."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdp import PolicyEngine, PolicySource
from pdp.service import load_sources, policy_files
from pep.core.lint import LintDocument, LintStream, contradiction, implies, lint
from pep.core.plan import SourceSpec, StreamDefinition
from pep.streams.definition import parse_schema

REPO = Path(__file__).resolve().parents[3]
NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
STRING = "http://www.w3.org/2001/XMLSchema#string"
CATEGORY = {"subject": "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
            "resource": "urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
            "action": "urn:oasis:names:tc:xacml:3.0:attribute-category:action"}
ATTRIBUTE = {"subject": "urn:oasis:names:tc:xacml:1.0:subject:subject-id",
             "resource": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
             "action": "urn:oasis:names:tc:xacml:1.0:action:action-id",
             "role": "urn:oasis:names:tc:xacml:2.0:subject:role"}
RULE_ALG = "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:"
FIRST = "urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable"


def match(what: str, value: str) -> str:
    category = CATEGORY["subject" if what == "role" else what]
    return (f'<Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">'
            f'<AttributeValue DataType="{STRING}">{value}</AttributeValue>'
            f'<AttributeDesignator Category="{category}" AttributeId="{ATTRIBUTE[what]}" '
            f'DataType="{STRING}" MustBePresent="false"/></Match>')


def target(*any_ofs: list[list[tuple[str, str]]]) -> str:
    """target([[(what, value), ...] per AllOf] per AnyOf)."""
    return "<Target>" + "".join(
        "<AnyOf>" + "".join("<AllOf>" + "".join(match(w, v) for w, v in all_of) + "</AllOf>"
                            for all_of in any_of) + "</AnyOf>" for any_of in any_ofs) + \
        "</Target>"


def obligation(kind: str, **values) -> str:
    items = "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{k.replace("_", "-")}">'
        f'<AttributeValue DataType="{STRING}">{v}</AttributeValue>'
        "</AttributeAssignmentExpression>"
        for k, vs in values.items() for v in (vs if isinstance(vs, list) else [vs]))
    return f'<ObligationExpression ObligationId="{kind}" FulfillOn="Permit">{items}' \
           "</ObligationExpression>"


def rule(rule_id: str, effect: str = "Permit", tgt: str = "", condition: str = "",
         obligations: str = "") -> str:
    obl = f"<ObligationExpressions>{obligations}</ObligationExpressions>" if obligations else ""
    return f'<Rule RuleId="{rule_id}" Effect="{effect}">{tgt}{condition}{obl}</Rule>'


def policy(policy_id: str, rules: str, tgt: str = "", alg: str = RULE_ALG + "deny-overrides"
           ) -> bytes:
    return (f'<Policy xmlns="{NS}" PolicyId="{policy_id}" Version="1.0" '
            f'RuleCombiningAlgId="{alg}">{tgt or "<Target/>"}{rules}</Policy>').encode()


WEATHER = target([[("resource", "weather")]])
LTA_READS = target([[("subject", "lta")]], [[("action", "read")]])
FILTER = "exacml:obligation:stream-filter"
MASK = "exacml:obligation:stream-mask"
WINDOW = "exacml:obligation:stream-window"


def window(kind: str, size: str = "5") -> str:
    return obligation(WINDOW, stream_window_type_id=kind, stream_window_size_id=size,
                      stream_window_step_id=size, stream_window_attr_id="rainrate:avg")


def weather_stream(name: str = "weather") -> StreamDefinition:
    entry = json.loads((REPO / "policies" / "streams.json").read_text())[0]
    return StreamDefinition(name, "nea", parse_schema(entry["schema"]),
                            SourceSpec("ingest", ()), "samplingtime")


STREAMS = [LintStream(weather_stream()), LintStream(weather_stream("pooled"), "union")]


def run(*documents: bytes, focus=None, streams=STREAMS):
    engine = PolicyEngine.compile([PolicySource(f"doc-{i}.xml", d)
                                   for i, d in enumerate(documents)])
    docs = [LintDocument(c.compiled.evaluator, c.source.name) for c in engine.documents()]
    return lint(docs, streams, focus=focus)


def kinds(findings) -> list[tuple[str, str | None, str | None]]:
    return [(f.kind, f.policy, f.rule) for f in findings]


def test_nothing_is_found_in_the_example_policies():
    engine = PolicyEngine.compile(load_sources(policy_files(REPO / "policies")))
    docs = [LintDocument(c.compiled.evaluator, c.source.name) for c in engine.documents()]
    entries = json.loads((REPO / "policies" / "streams.json").read_text())
    from pep.core.schemas import BUILTIN_SCHEMAS
    streams = []
    for e in entries:
        schema = parse_schema(e["schema"]) if "schema" in e else \
            BUILTIN_SCHEMAS[e["source"]["schema"]]
        streams.append(LintStream(StreamDefinition(e["name"], e["owner"], schema,
                                                   SourceSpec("ingest", ())),
                                  e.get("combining", "intersection")))
    assert len(docs) == 5 and len(streams) == 5
    assert lint(docs, streams) == []


def test_a_policy_and_a_rule_no_request_can_match():
    both = target([[("resource", "weather"), ("resource", "ais")]])
    found = run(policy("urn:p:never", rule("r1", tgt=LTA_READS), tgt=both),
                policy("urn:p:elsewhere", rule("r2", tgt=target([[("resource", "ais")]])),
                       tgt=WEATHER),
                policy("urn:p:false", rule("r3", condition=(
                    '<Condition><AttributeValue DataType="http://www.w3.org/2001/XMLSchema#'
                    'boolean">false</AttributeValue></Condition>')), tgt=WEATHER))
    assert kinds(found) == [("never-applies", "urn:p:never", None),
                            ("never-applies", "urn:p:elsewhere", "r2"),
                            ("never-applies", "urn:p:false", "r3")]
    assert found[0].message == ("the policy can never apply: it asks resource-id to be 'ais' "
                                "and 'weather' at once, and a request has one; none of its "
                                "rules is ever evaluated")
    assert found[1].message == ("the rule can never apply: with the targets of the policies "
                                "around it, one target asks resource-id to be 'weather', "
                                "another 'ais', and a request has one")
    assert found[2].message == "the rule can never apply: its Condition is always false"
    assert found[0].line == 1 and found[0].source == "doc-0.xml"
    assert found[1].text().startswith("never-applies: line 1: rule r2 (policy urn:p:elsewhere)")


def test_a_rule_shadowed_under_first_applicable_and_one_that_can_never_win():
    found = run(
        policy("urn:p:first", rule("lta-any", tgt=target([[("subject", "lta")]]))
               + rule("lta-read", tgt=LTA_READS,
                      obligations=obligation(FILTER, stream_filter_condition_id="rainrate > 5"))
               + rule("other-read", tgt=target([[("subject", "other")]])), WEATHER, FIRST),
        policy("urn:p:overrides", rule("deny-other", "Deny", target([[("subject", "other")]]))
               + rule("permit-other", tgt=target([[("subject", "other")]], [[("action", "read")]]))
               + rule("permit-lta", tgt=LTA_READS), WEATHER))
    assert kinds(found) == [("shadowed", "urn:p:first", "lta-read"),
                            ("shadowed", "urn:p:overrides", "permit-other")]
    assert "rule lta-any comes first and applies whenever this one would" in found[0].message
    assert found[1].message == ("the rule can never decide (Permit): rule deny-other (Deny, "
                                "without a Condition) applies whenever this one would, and "
                                "deny-overrides lets Deny win")


def test_obligations_the_pep_does_not_understand():
    found = run(policy("urn:p:unknown", rule(
        "r", tgt=LTA_READS,
        obligations=obligation("urn:acme:obligation:log-access", reason="audit")
        + obligation(FILTER, stream_filter_expr="rainrate > 5")), WEATHER))
    assert kinds(found) == [("unknown-obligation", "urn:p:unknown", "r")] * 2
    assert found[0].message.startswith("obligation 'urn:acme:obligation:log-access' is not one "
                                       "the PEP understands: every Permit that carries it is a "
                                       "Deny at the gateway")
    assert "exacml:obligation:stream-filter-expr" in found[1].message


def test_grants_that_overlap_with_conflicting_windows_or_incomparable_masks():
    tuples = policy("urn:p:tuples", rule("lta-tuples", tgt=LTA_READS,
                                         obligations=window("tuple")), WEATHER)
    times = policy("urn:p:times", rule("lta-times", tgt=target([[("subject", "lta")]]),
                                       obligations=window("time", "60")), WEATHER)
    found = run(tuples, times)
    assert kinds(found) == [("conflict", "urn:p:tuples", "lta-tuples")]
    assert found[0].message == (
        "rules lta-tuples (policy urn:p:tuples) and lta-times (policy urn:p:times) can both "
        "apply to a request about stream 'weather', and their obligations cannot be honoured "
        "together, so such a request is denied: applicable policies require windows of "
        "different types (time and tuple); no window satisfies all of them")
    assert found[0].others == ("urn:p:times",)
    masks = policy("urn:p:masks",
                   rule("round4", tgt=LTA_READS, obligations=obligation(
                       MASK, stream_mask_attribute_id="rainrate:round:4"))
                   + rule("round6", tgt=LTA_READS, obligations=obligation(
                       MASK, stream_mask_attribute_id="rainrate:round:6")), WEATHER)
    found = run(masks)
    assert kinds(found) == [("conflict", "urn:p:masks", "round4")]
    assert "round:4" in found[0].message and "round:6" in found[0].message
    # under first-applicable only one of them ever applies: no conflict (the second is dead)
    assert kinds(run(masks.replace((RULE_ALG + "deny-overrides").encode(), FIRST.encode()))) \
        == [("shadowed", "urn:p:masks", "round6")]
    # for different actions, or different streams, they never meet
    apart = policy("urn:p:apart", rule("w", tgt=LTA_READS, obligations=window("tuple"))
                   + rule("t", tgt=target([[("subject", "lta")]], [[("action", "count")]]),
                          obligations=window("time", "60")), WEATHER)
    assert run(apart) == []


def test_a_masked_grant_on_a_union_stream():
    pooled = target([[("resource", "pooled")]])
    found = run(policy("urn:p:pooled",
                       rule("masked", tgt=LTA_READS, obligations=obligation(
                           MASK, stream_mask_attribute_id="rainrate:round:10"))
                       + rule("plain", tgt=LTA_READS), pooled))
    assert kinds(found) == [("conflict", "urn:p:pooled", "masked")]
    assert "stream 'pooled' combines grants by union, which cannot unite a grant with masks" \
        in found[0].message


def test_a_filter_that_can_never_hold_and_two_that_never_hold_together():
    found = run(policy("urn:p:nr", rule("never", tgt=LTA_READS, obligations=obligation(
        FILTER, stream_filter_condition_id="rainrate &gt; 10 AND rainrate &lt; 5")), WEATHER))
    assert kinds(found) == [("no-result", "urn:p:nr", "never")]
    assert found[0].message == ("no consumer ever gets a tuple of stream 'weather' through this "
                                "rule: its filter `rainrate > 10 AND rainrate < 5` can never "
                                "hold (NR)")
    found = run(policy("urn:p:pair",
                       rule("wet", tgt=LTA_READS, obligations=obligation(
                           FILTER, stream_filter_condition_id="rainrate &gt; 10"))
                       + rule("dry", tgt=LTA_READS, obligations=obligation(
                           FILTER, stream_filter_condition_id="rainrate &lt; 5")), WEATHER))
    assert kinds(found) == [("no-result", "urn:p:pair", "wet")]
    assert "`rainrate > 10` AND `rainrate < 5`" in found[0].message
    # a placeholder's value is known only at decision time: not judged
    assert run(policy("urn:p:ph", rule("r", tgt=LTA_READS, obligations=obligation(
        FILTER, stream_filter_condition_id="rainrate &gt; {subject:limit} AND rainrate &lt; 0")),
        WEATHER)) == []


def test_focus_keeps_only_what_concerns_the_documents_written():
    tuples = policy("urn:p:tuples", rule("lta-tuples", tgt=LTA_READS,
                                         obligations=window("tuple")), WEATHER)
    times = policy("urn:p:times", rule("lta-times", tgt=LTA_READS,
                                       obligations=window("time", "60")), WEATHER)
    dead = policy("urn:p:dead", rule("r", tgt=target([[("resource", "ais")]])), WEATHER)
    found = run(tuples, dead, times, focus=["urn:p:times"])
    assert kinds(found) == [("conflict", "urn:p:times", "lta-times")]
    assert found[0].others == ("urn:p:tuples",)
    assert kinds(run(tuples, dead, times, focus=["urn:p:dead"])) == [
        ("never-applies", "urn:p:dead", "r")]


@pytest.mark.parametrize("these, those, expected", [
    ([[[("subject", "lta")], [("subject", "x")]]], [[[("subject", "lta")]]], False),
    ([[[("subject", "lta")]], [[("action", "read")]]], [[[("subject", "lta")]]], True),
    ([[[("subject", "lta"), ("action", "read")]]], [[[("subject", "lta")], [("subject", "x")]]],
     True),
    ([], [[[("subject", "lta")]]], False),
    ([[[("subject", "lta")]]], [], True),
])
def test_implication_of_targets(these, those, expected):
    def notes(any_ofs):
        doc = policy("urn:p:i", "", target(*any_ofs) if any_ofs else "")
        ev = PolicyEngine.compile([PolicySource("t", doc)]).documents()[0].compiled.evaluator
        return ev.notes.target
    assert implies([notes(these)], [notes(those)]) is expected
    assert contradiction([notes(these), notes(those)]) is None
