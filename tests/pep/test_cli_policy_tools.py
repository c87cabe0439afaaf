"""The policy author's commands: `xsg pdp decide --explain`, `xsg policy lint`, `xsg policy
test` (their exit statuses and what they print)."""
from __future__ import annotations

from pathlib import Path

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
