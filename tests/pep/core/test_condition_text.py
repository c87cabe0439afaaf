"""Warnings print a predicate exactly as its author wrote it (issue 42): `written_text` renders
a bound condition, NOTs included, and the text parses and binds back to the same condition,
for every operator of the condition language. And the NR/PR analysis names the policy's
predicates with their NOTs: the AIS `read-traffic` grant (`NOT WITHIN_POLYGON(...)`) end to end
through the PDP and the merge, where its warning is made."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from common.auth import Identity
from pdp.engine import PolicyEngine, PolicySource
from pep.core.access import caller_resolver, decide_and_plan
from pep.core.analysis import analyse_filter
from pep.core.conditions import Not, parse, parse_condition
from pep.core.graph import AIS_SCHEMA
from pep.core.plan import Field, StreamSchema
from pep.streams.definition import parse_schema

POLICIES = Path(__file__).resolve().parents[3] / "policies"
POSITION = parse_schema(next(s for s in json.loads((POLICIES / "streams.json").read_text())
                             if s["name"] == "position")["schema"])
SCHEMA = StreamSchema(POSITION.fields + (
    Field("name", "string"), Field("speed", "double"), Field("n", "long"),
    Field("ok", "boolean"), Field("mmsi", "long")))
PORT = (1.15, 103.6, 1.15, 104.05, 1.30, 104.05, 1.30, 103.6)
CALLER = Identity("mpa", ("port-authority",), attributes=(
    ("urn:xsg:port-bounds", PORT), ("urn:xsg:port-lat", (1.264,)),
    ("urn:xsg:port-lon", (103.84,)), ("urn:xsg:ship-mmsi", (244000001,)),
    ("urn:xsg:names", ("a", "b'c"))))

# Every operator of the language (pep/core/conditions/parsing.py's grammar), each alone and
# under NOT, with the spellings the lexer takes for the same operator.
PREDICATES = [
    "speed < 5", "speed > 5", "speed <= 5.25", "speed >= -5", "speed = 5", "speed != 5",
    "speed == 5", "speed <> 5", "speed ≤ 5", "speed ≥ 5", "speed ≠ 5", "5 < speed",
    "n > 9007199254740993", "n <= 2.5", "ts >= '2026-01-01T00:00:00Z'", "ts < 1714550400",
    "name = 'it\\'s'", "name != 'a\\\\b'", "name = 'line\\nbreak'", "ok = true", "ok != FALSE",
    "TRUE", "FALSE",
    "speed IN (1, 2.5, 3)", "speed NOT IN (1, 2)", "name IN {subject:names}",
    "name NOT IN {subject:names}", "name IN ('x')",
    "WITHIN_BOX(lat, lon, 1, 103, 2, 104)", "WITHIN_BOX(lat, lon, 1, 179, 2, -179)",
    "DISTANCE(lat, lon, 1.264, 103.84) <= 92600",
    "DISTANCE(lat, lon, {subject:port-lat}, {subject:port-lon}) > 1",
    "DISTANCE_TO(lat, lon, mmsi, 244000001) < 500",
    "DISTANCE_TO(lat, lon, mmsi, {subject:ship-mmsi}) >= 10",
    "WITHIN_POLYGON(lat, lon, [1.15, 103.6, 1.15, 104.05, 1.3, 104.05])",
    "WITHIN_POLYGON(lat, lon, {subject:port-bounds})",
    "level DOMINATED_BY 'S:{nuclear,crypto}'", "level DOMINATES 'C'", "level = 'U'",
    "level != 'TS:{army}'",
]
COMPOUND = [
    "speed > 5 AND n < 3", "speed > 5 OR n < 3", "(speed > 5 OR n < 3) AND ok = true",
    "speed > 5 OR (n < 3 AND ok = true)", "NOT (speed > 5 AND n < 3)",
    "NOT (speed > 5 OR NOT n < 3)", "NOT NOT speed > 5",
    "speed > 1 AND NOT WITHIN_POLYGON(lat, lon, {subject:port-bounds}) OR level DOMINATES 'S'",
]


def bound(text: str):
    return parse_condition(text, SCHEMA, resolver=caller_resolver(CALLER, "ais"))


def unplaced(expr):
    """The condition without source positions (a text written back has other columns)."""
    if dataclasses.is_dataclass(expr) and not isinstance(expr, type):
        changes = {f.name: unplaced(getattr(expr, f.name)) for f in dataclasses.fields(expr)}
        if "position" in changes:
            changes["position"] = 0
        return dataclasses.replace(expr, **changes)
    if isinstance(expr, tuple):
        return tuple(unplaced(x) for x in expr)
    return expr


@pytest.mark.parametrize("text", PREDICATES + [f"NOT {p}" for p in PREDICATES] + COMPOUND)
def test_every_operator_is_written_back_as_the_same_predicate(text):
    from pep.core.analysis.atoms import written_text  # what the warnings print with

    condition = bound(text)
    written = written_text(condition)
    again = bound(written)
    assert unplaced(again) == unplaced(condition), (text, written)
    assert written_text(again) == written  # a fixed point: what a warning prints is stable
    if text.startswith("NOT ") and text[4:] in PREDICATES:
        assert isinstance(parse(text), Not)
        assert written.startswith("NOT ") or not isinstance(condition, Not), written


def test_a_negated_predicate_is_never_printed_without_its_not():
    square = "[1.15, 103.6, 1.15, 104.05, 1.3, 104.05, 1.3, 103.6]"
    cases = [
        (f"NOT WITHIN_POLYGON(lat, lon, {square})", None,
         f"NOT WITHIN_POLYGON(lat, lon, {square})"),
        ("NOT speed > 5", None, "NOT speed > 5"),
        ("NOT (speed > 5 AND course < 3)", "speed > 1", "NOT (speed > 5 AND course < 3)"),
        ("NOT DISTANCE(lat, lon, 1.264, 103.84) <= 9000", None,
         "NOT DISTANCE(lat, lon, 1.264, 103.84) <= 9000"),
    ]
    for policy, user, predicate in cases:
        result = analyse_filter(parse_condition(policy, AIS_SCHEMA),
                                parse_condition(user, AIS_SCHEMA) if user else None, AIS_SCHEMA)
        (pr,) = [w for w in result.warnings if w.kind == "PR"]
        assert pr.predicates == (predicate,), pr
        assert pr.message.endswith(f"policy predicates that such tuples fail: {predicate}")
    # a contradiction names the policy's predicate as written too
    result = analyse_filter(parse_condition("speed > 5 AND NOT speed > 7", AIS_SCHEMA),
                            parse_condition("speed > 9", AIS_SCHEMA), AIS_SCHEMA)
    assert result.nr and result.warnings[0].predicates == ("NOT speed > 7", "speed > 9")
    assert "NOT speed > 7 (policy, i.e. speed <= 7) contradicts speed > 9 (your query)" in \
        result.warnings[0].message
    result = analyse_filter(parse_condition("NOT (speed > 5 OR speed < 7)", AIS_SCHEMA), None,
                            AIS_SCHEMA)
    assert result.warnings[0].predicates == ("NOT (speed > 5 OR speed < 7)",)
    assert "NOT (speed > 5 OR speed < 7) (policy, i.e. speed <= 5) contradicts " \
        "NOT (speed > 5 OR speed < 7) (policy, i.e. speed >= 7)" in result.warnings[0].message


def test_the_ais_read_traffic_warning_keeps_the_policys_not():
    """The shipped AIS policy, decided by the PDP for a port authority asking `read-traffic`
    (ships outside its port waters): the warning names `NOT WITHIN_POLYGON(...)`, as the
    policy has it, never the opposite."""
    path = POLICIES / "ais" / "port-authority-policy.xml"
    engine = PolicyEngine.compile([PolicySource(str(path), path.read_bytes())])
    request = (POLICIES / "ais" / "port-authority-traffic-request.xml").read_bytes()
    bounds = (1.15, 103.6, 1.15, 104.05, 1.30, 104.05, 1.30, 103.6)
    caller = Identity("mpa", ("port-authority",),
                      attributes=(("urn:xsg:port-bounds", bounds),))
    grant = decide_and_plan(engine, request, "application/xacml+xml", caller,
                            lambda name: AIS_SCHEMA if name == "ais" else None)
    texts = [p for w in grant.warnings if (w.kind, w.operator) == ("PR", "filter")
             for p in w.predicates]
    assert texts == ["NOT WITHIN_POLYGON(lat, lon, [1.15, 103.6, 1.15, 104.05, 1.3, 104.05, "
                     "1.3, 103.6])"], grant.warnings
    message = next(w.message for w in grant.warnings if w.operator == "filter")
    assert "fail: NOT WITHIN_POLYGON(" in message
