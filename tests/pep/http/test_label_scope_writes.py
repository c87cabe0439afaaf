"""A window's label scope through the gateway (issue 41, item 4): a policy gets the MLS DSMS
paper's shape unless its owner writes `stream-window-label-scope-id` `all`, and then every
write answer (POST, PUT, their dry runs, bulk) warns that the choice leaks the presence of
higher tuples, quoting the bound; a low reader's plan shows which shape it got."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from common.auth import write_auth_file
from tests.pep.conftest import TOKENS, RecordingRuntime, auth_header, build_gateway

POLICIES = Path(__file__).resolve().parents[3] / "policies"
SHIPPED = (POLICIES / "mls" / "position-policy.xml").read_bytes()
COUNT = (POLICIES / "mls" / "analyst-count-request.xml").read_bytes()
POSITION = next(s for s in json.loads((POLICIES / "streams.json").read_text())
                if s["name"] == "position")
XML = {"Content-Type": "application/xacml+xml"}
PID = "urn:xsg:example:mls:position-policy"
BOUND = "level DOMINATED_BY {subject:session}"
SCOPE_ID = "exacml:obligation:stream-window-label-scope-id"


def scoped(scope: str, policy: bytes = SHIPPED) -> bytes:
    """The shipped policy with a label scope on its window."""
    marker = b'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-label'
    assert policy.count(marker) == 1
    return policy.replace(marker, (
        f'<AttributeAssignmentExpression AttributeId="{SCOPE_ID}"><AttributeValue '
        f'DataType="http://www.w3.org/2001/XMLSchema#string">{scope}</AttributeValue>'
        '</AttributeAssignmentExpression>\n        ').encode() + marker)


LEAKY = scoped("all")


def leak_warnings(answer: dict) -> list[str]:
    return [w for w in answer.get("warnings", []) if "presence" in w]


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    TOKENS["analyst-low"] = "tok-analyst-low-0123456789"
    write_auth_file(data / "auth.json", [
        {"token": TOKENS["nea"], "subject": "nea", "roles": ["data-owner"], "admin": True},
        {"token": TOKENS["lta"], "subject": "lta", "roles": ["consumer"], "admin": False},
        {"token": TOKENS["analyst-low"], "subject": "analyst-low", "roles": ["analyst"],
         "admin": False, "attributes": {"clearance": "C:{nuclear}"}}])
    app, services = build_gateway(data, RecordingRuntime())
    client = app.test_client()
    r = client.post("/streams", headers=auth_header("nea"), json={
        k: POSITION[k] for k in ("name", "time_attribute", "source", "schema")})
    assert r.status_code == 201, r.json
    yield client
    services.close()
    TOKENS.pop("analyst-low", None)


def plan_of(client) -> dict:
    r = client.post("/requests", data=COUNT, headers=auth_header("analyst-low", **XML))
    assert r.status_code in (200, 201), r.json  # 200: the same plan as a live handle's
    return r.json["plan"]


def test_the_shipped_policy_writes_without_a_warning_and_filters_before_the_window(gw):
    client = gw
    r = client.post("/policies", data=SHIPPED, headers=auth_header("nea", **XML))
    assert r.status_code == 201 and r.json["warnings"] == [], r.json
    plan = plan_of(client)
    assert plan["filter"] == [[{"attribute": "level", "op": "<=", "label": "C:{nuclear}"}]]
    assert "label_bounds" not in plan["window"]
    # the default written out is the same policy, and the same plan
    r = client.put(f"/policies/{PID}", data=scoped("dominated"), headers=auth_header("nea", **XML))
    assert r.status_code == 200 and r.json["warnings"] == [], r.json
    assert plan_of(client)["filter"] == plan["filter"]


def test_every_write_of_the_opt_in_warns_that_it_leaks_presence(gw):
    client = gw
    r = client.post("/policies?dry_run=true", data=LEAKY, headers=auth_header("nea", **XML))
    assert r.status_code == 200 and r.json["dry_run"] is True, r.json
    (dry,) = leak_warnings(r.json)
    assert f"`{BOUND}`" in dry and "'all'" in dry and "line " in dry
    assert client.get(f"/policies/{PID}", headers=auth_header("nea")).status_code == 404
    r = client.post("/policies", data=LEAKY, headers=auth_header("nea", **XML))
    assert r.status_code == 201 and leak_warnings(r.json) == [dry], r.json
    # as documented: every tuple enters the window, windows above the session are withheld
    plan = plan_of(client)
    assert "filter" not in plan or plan["filter"] is None, plan
    assert plan["window"]["label_bounds"] == [{"attribute": "level",
                                               "dominated_by": "C:{nuclear}"}]
    for query in ("?dry_run=true", ""):
        r = client.put(f"/policies/{PID}{query}", data=LEAKY.replace(b'Version="1.0"',
                                                                    b'Version="1.1"'),
                       headers=auth_header("nea", **XML))
        assert r.status_code == 200 and leak_warnings(r.json) == [dry], r.json
    # back to the default: no warning, and the plan filters again
    r = client.put(f"/policies/{PID}", data=SHIPPED.replace(b'Version="1.0"', b'Version="1.2"'),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200 and r.json["warnings"] == []
    assert "label_bounds" not in plan_of(client)["window"]
    r = client.delete(f"/policies/{PID}", headers=auth_header("nea"))
    assert r.status_code in (200, 204)
    files = {"a": (io.BytesIO(LEAKY.replace(PID.encode(), b"urn:t:bulk-leaky")), "leaky.xml",
                   "application/xml")}
    r = client.post("/policies/bulk", data=files, headers=auth_header("nea"),
                    content_type="multipart/form-data")
    assert r.status_code == 201, r.json
    (bulk,) = leak_warnings(r.json)
    assert bulk.startswith("part 1 (leaky.xml): ") and f"`{BOUND}`" in bulk


def test_a_computed_label_scope_is_warned_about_too(gw):
    client = gw
    computed = SHIPPED.replace(
        b'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-label',
        (f'<AttributeAssignmentExpression AttributeId="{SCOPE_ID}"><AttributeDesignator '
         'Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject" '
         'AttributeId="scope" DataType="http://www.w3.org/2001/XMLSchema#string" '
         'MustBePresent="false"/></AttributeAssignmentExpression>'
         '<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-label'
         ).encode())
    r = client.post("/policies?dry_run=true", data=computed, headers=auth_header("nea", **XML))
    assert r.status_code == 200, r.json
    assert any("may be 'all'" in w and "presence" in w for w in r.json["warnings"]), r.json


def scope_value(value: str) -> bytes:
    return (f'<AttributeAssignmentExpression AttributeId="{SCOPE_ID}"><AttributeValue '
            f'DataType="http://www.w3.org/2001/XMLSchema#string">{value}</AttributeValue>'
            '</AttributeAssignmentExpression>').encode()


def unbounded(scope: str) -> bytes:
    """The shipped policy without its window's label bound, with a label scope."""
    start = SHIPPED.index(b'<AttributeAssignmentExpression AttributeId="exacml:obligation:'
                          b'stream-window-label-bound-id">')
    end = SHIPPED.index(b"</AttributeAssignmentExpression>", start) \
        + len(b"</AttributeAssignmentExpression>")
    return SHIPPED[:start] + scope_value(scope) + SHIPPED[end:]


@pytest.mark.parametrize("document, words", [
    (scoped("some"), ["'some'", "'dominated'", "'all'"]),
    (scoped("all").replace(scope_value("all"), scope_value("all") + scope_value("dominated")),
     ["more than one"]),
    (unbounded("all"), ["stream-window-label-scope-id", "stream-window-label-bound-id"]),
])
def test_a_label_scope_the_pep_cannot_follow_is_refused_at_write(gw, document, words):
    client = gw
    for query in ("?dry_run=true", ""):
        r = client.post(f"/policies{query}", data=document, headers=auth_header("nea", **XML))
        assert r.status_code == 400, r.json
        assert all(w in r.json["error"] for w in words), r.json
        assert "'position'" in r.json["error"] and r.json["element"] == "ObligationExpression"
    assert client.get(f"/policies/{PID}", headers=auth_header("nea")).status_code == 404


def test_the_warning_quotes_a_literal_bound_exactly_as_written(gw):
    client = gw
    literal = "level DOMINATED_BY 'S:{nuclear}'"
    document = LEAKY.replace(BOUND.encode(), literal.encode())
    r = client.post("/policies?dry_run=true", data=document, headers=auth_header("nea", **XML))
    assert r.status_code == 200, r.json
    (warning,) = leak_warnings(r.json)
    assert f"label bound `{literal}`:" in warning
