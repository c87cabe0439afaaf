"""The policy author's commands: `xsg pdp decide --explain`, `xsg policy lint`, `xsg policy
test` (their exit statuses and what they print)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pep.cli import main

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_pdp_decide_explain_prints_the_response_then_why(capsys):
    code, out, _ = run(capsys, "pdp", "decide", "--policies", str(POLICIES), "--request",
                       str(POLICIES / "weather" / "lta-request.xml"), "--explain")
    assert code == 0
    response, _, why = out.partition("\nwhy:\n")
    assert "<Decision>Permit</Decision>" in response
    assert "first-applicable: rule urn:xsg:example:weather:lta-reads-windows was the first " \
           "child that applied (Permit)" in why
    assert "obligation exacml:obligation:stream-window from rule " \
           "urn:xsg:example:weather:lta-reads-windows" in why
    assert "missing attributes: none" in why
    code, out, _ = run(capsys, "pdp", "decide", "--policies", str(POLICIES), "--request",
                       str(POLICIES / "weather" / "lta-request.xml"))
    assert code == 0 and "why:" not in out


# -- xsg policy lint ------------------------------------------------------------------------------

CONFLICT = b"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="urn:t:times"
  Version="1" RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
  <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
    <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">weather</AttributeValue>
    <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
      AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
      DataType="http://www.w3.org/2001/XMLSchema#string" MustBePresent="false"/>
  </Match></AllOf></AnyOf></Target>
  <Rule RuleId="lta-hourly" Effect="Permit">
    <ObligationExpressions>
      <ObligationExpression ObligationId="exacml:obligation:stream-window" FulfillOn="Permit">
        <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-type-id">
          <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">time</AttributeValue>
        </AttributeAssignmentExpression>
        <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-size-id">
          <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">3600</AttributeValue>
        </AttributeAssignmentExpression>
        <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-step-id">
          <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">3600</AttributeValue>
        </AttributeAssignmentExpression>
        <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-attr-id">
          <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">rainrate:avg</AttributeValue>
        </AttributeAssignmentExpression>
      </ObligationExpression>
    </ObligationExpressions>
  </Rule>
</Policy>
"""  # noqa: E501 - the tests read findings' line numbers: the document keeps its lines


def test_policy_lint_finds_nothing_in_the_examples_and_says_so(capsys):
    code, out, _ = run(capsys, "policy", "lint", str(POLICIES))
    assert code == 0 and out == "0 findings in 5 policies, 5 streams\n"


def test_policy_lint_reports_each_finding_with_file_and_line_and_exits_1(capsys, tmp_path):
    (tmp_path / "times.xml").write_bytes(CONFLICT)
    weather = str(POLICIES / "weather" / "nea-weather-policy.xml")
    code, out, _ = run(capsys, "policy", "lint", weather, str(tmp_path / "times.xml"),
                       "--streams", str(POLICIES / "streams.json"))
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"{weather}:53: conflict: line 53: rule "
                               "urn:xsg:example:weather:lta-reads-windows (policy "
                               "urn:xsg:example:weather:nea-policy): rules ")
    assert "windows of different types (time and tuple)" in lines[0]
    assert lines[1] == "1 finding in 2 policies, 5 streams"
    # without the streams there is nothing to check the grants on
    code, out, _ = run(capsys, "policy", "lint", weather, str(tmp_path / "times.xml"))
    assert code == 0 and "no streams" in out
    code, out, _ = run(capsys, "policy", "lint", weather, str(tmp_path / "times.xml"),
                       "--streams", str(POLICIES / "streams.json"), "--json")
    assert code == 1 and json.loads(out)[0]["kind"] == "conflict"
    # a sharing rule is linted as the XACML it compiles to
    code, out, _ = run(capsys, "policy", "lint", weather,
                       str(POLICIES / "weather" / "lta-rule.yaml"), "--streams",
                       str(POLICIES / "streams.json"))
    assert code == 0, out


def test_policy_lint_refuses_what_it_cannot_read(capsys, tmp_path):
    (tmp_path / "bad.xml").write_bytes(
        b"<Policy xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'/>"
    )
    code, _, err = run(capsys, "policy", "lint", str(tmp_path / "bad.xml"))
    assert code == 2 and "invalid policy" in err and "bad.xml" in err
    code, _, err = run(capsys, "policy", "lint")
    assert code == 2 and "give policy files" in err
    code, _, err = run(capsys, "policy", "lint", str(tmp_path / "none.xml"))
    assert code == 2 and "no such file" in err


def test_policy_lint_over_a_running_gateway(capsys, tmp_path):
    from tests.console.conftest import start_gateway
    from tests.pep.conftest import TOKENS

    gw = start_gateway(tmp_path / "gw")
    try:
        gw.add_weather()
        gw.add_weather_policy()
        r = gw.api("POST", "/policies", data=CONFLICT,
                   headers={"Content-Type": "application/xacml+xml"})
        assert r.status_code == 201 and r.json()["warnings"][0].startswith("conflict: ")
        code, out, _ = run(capsys, "policy", "--token", TOKENS["nea"], "lint", "--url", gw.url)
        assert code == 1
        assert out.startswith(f"{gw.url}/policies/urn%3At%3Atimes:9: conflict: line 9: rule "
                              "lta-hourly (policy urn:t:times)")
        assert out.endswith("1 finding in 2 policies, 1 stream\n")
    finally:
        gw.close()


# -- xsg policy test ------------------------------------------------------------------------------

def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("@POLICIES@", str(POLICIES)))
    return path


MALFORMED = [
    ("not: [yaml", 1, "not YAML"),
    ("policies: @POLICIES@/weather\ncases: []\n", 2, "cases: the file has no case"),
    ("cases:\n  - name: x\n", 1, "the test file: 'policies' is required"),
    ("policies: @POLICIES@/nowhere.xml\ncases: []\n", 1, "no such file or directory"),
    ("policies: @POLICIES@/weather\ncases:\n  - name: x\n    request: {resource: weather, "
     "action: read}\n    expect: {decision: Permit}\n", 4, "needs `subject`"),
    ("policies: @POLICIES@/weather\ncases:\n  - name: x\n    subject: {id: lta}\n"
     "    request: {resource: weather, action: read}\n    expect: {decision: Allow}\n", 6,
     "decision must be one of Permit, Deny, NotApplicable, Indeterminate, not 'Allow'"),
    ("policies: @POLICIES@/weather\ncases:\n  - name: x\n    subject: {id: lta}\n"
     "    request: {resource: weather, action: read}\n    expected: {decision: Permit}\n", 6,
     "unknown key 'expected'"),
    ("policies: @POLICIES@/weather\nstreams: @POLICIES@/streams.json\ncases:\n  - name: x\n"
     "    stream: weather\n    subject: {id: lta}\n    request: {action: read}\n"
     "    records: [{rainrate: lots}]\n    expect: {rows: []}\n", 8,
     "records (record 1, field 'rainrate')"),
    ("policies: @POLICIES@/weather\ncases:\n  - name: x\n    subject: {id: lta}\n"
     "    request: {resource: weather, action: read}\n    expect: {decision: Permit}\n"
     "  - name: x\n    subject: {id: lta}\n    request: {resource: weather, action: read}\n"
     "    expect: {decision: Permit}\n", 7, "a case of this name is at line 3"),
]


def test_a_malformed_test_file_says_file_line_and_what_and_exits_2(capsys, tmp_path):
    for text, line, message in MALFORMED:
        path = write(tmp_path, text)
        code, out, _ = run(capsys, "policy", "test", str(path))
        assert code == 2, (text, out)
        assert f"ERROR {path}:{line}: " in out and message in out, (text, out)
    # the other files still run; the bad one makes the status 2
    good = write(tmp_path, "policies: @POLICIES@/weather\ncases:\n  - name: ok\n"
                 "    subject: {id: lta}\n    request: {resource: weather, action: read}\n"
                 "    expect: {decision: Permit}\n", "good.yaml")
    code, out, _ = run(capsys, "policy", "test", str(path), str(good))
    assert code == 2 and "  ok    ok (decision, line 3)" in out
    assert out.endswith("1 case in 1 file: 1 passed, 0 failed; 1 file could not be run\n")
    code, _, err = run(capsys, "policy", "test", str(tmp_path / "absent"))
    assert code == 2 and "no such file" in err


@pytest.mark.timeout(300)
def test_the_examples_pass_and_a_failing_file_says_what_differs(capsys, spark, tmp_path):
    code, out, _ = run(capsys, "policy", "test", str(REPO / "examples" / "policy-tests"))
    assert code == 0, out
    assert "FAIL" not in out and "cases in 3 files" in out and ", 0 failed" in out
    junit = tmp_path / "results.xml"
    code, out, _ = run(capsys, "policy", "test", str(REPO / "tests" / "pep" / "policy-tests"),
                       "--junit", str(junit))
    assert code == 1
    assert "  ok    passes (decision, line 7)" in out
    assert "  FAIL  a wrong decision (decision, line 12)\n" \
           "        decision: expected Permit, got Deny\n        why:\n" in out
    assert "rule urn:xsg:example:weather:deny-everyone-else was the first child that applied " \
           "(Deny)" in out
    assert "-  pCloud:obligation:stream-filter-condition-id = rainrate > 50\n" in out
    assert "+  pCloud:obligation:stream-filter-condition-id = rainrate > 5\n" in out
    assert "  FAIL  wrong rows (stream weather, line 26)\n" \
           "        rows: expected 2, got 3\n" in out
    assert '-{"avg_rainrate": 12.5, "lastval_samplingtime": "2026-12-01T08:10:00.000000Z"' in out
    assert '+{"avg_rainrate": 13.2, "lastval_samplingtime": "2026-12-01T08:12:00.000000Z"' in out
    assert out.endswith("4 cases in 1 file: 1 passed, 3 failed\n")
    from lxml import etree
    suite = etree.parse(str(junit)).getroot()[0]
    assert suite.get("tests") == "4" and suite.get("failures") == "3"
    assert [c.get("name") for c in suite if c.find("failure") is not None] == [
        "a wrong decision", "wrong obligations", "wrong rows"]
