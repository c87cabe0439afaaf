"""Every case of the shared XACML 3.0 conformance suite, in XML and in the JSON Profile."""
from __future__ import annotations

from pathlib import Path

import pytest

from pdp.conformance import _diff, discover, normalize_xml_response, run_case

SUITE = Path(__file__).resolve().parents[3].parent / "shared" / "conformance" / "xacml3"

if not SUITE.is_dir():
    pytest.skip(f"conformance suite not found at {SUITE}", allow_module_level=True)

MANDATORY = discover(SUITE / "mandatory")
OTHERS = discover(SUITE / "others")


@pytest.mark.parametrize("fmt", ["xml", "json"])
@pytest.mark.parametrize("case", MANDATORY, ids=lambda c: c.name)
def test_mandatory(case, fmt):
    status, reason = run_case(case, fmt)
    if status == "skip":
        pytest.skip(reason)
    assert status == "pass", reason


@pytest.mark.parametrize("case", OTHERS, ids=lambda c: c.name)
def test_others(case):
    status, reason = run_case(case, "xml")
    if status == "skip":
        pytest.skip(reason)
    assert status == "pass", reason


def test_suite_is_complete():
    assert len(MANDATORY) >= 340
    assert len(OTHERS) >= 23


def test_comparison_detects_a_different_obligation():
    base = (SUITE / "mandatory" / "IIIA001" / "Response.xml").read_bytes()
    changed = base.replace(b"Victor Frankenstein", b"Victor Frank")
    assert _diff(normalize_xml_response(base), normalize_xml_response(base)) is None
    assert "Obligations" in _diff(normalize_xml_response(base), normalize_xml_response(changed))
