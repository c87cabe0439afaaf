"""A handle on a punctuated stream runs with its subject's roles (the punctuations' SRPs are read
against them): they are in its plan when it opens, and a change of the subject's roles revokes
it at once even when the XACML decision is the same (on main nothing looked at the roles: the
handle would have gone on with the old ones). The gateway is the real one with a recording
stand-in for Spark."""
from __future__ import annotations

import io
import json
import os
import time

import pytest

from pep.handles.records import HandleState
from tests.pep.conftest import RecordingRuntime, build_gateway

TOKENS = {"nea": "tok-nea-0123456789", "m1": "tok-medic1-0123456789",
          "m2": "tok-medic2-0123456789"}
BEDSIDE = {"name": "bedside", "source": {"kind": "ingest", "punctuations": "on"},
           "schema": [{"name": "patient", "type": "long"}, {"name": "hr", "type": "double"}]}
RULE = {"stream": "bedside", "who": {"roles": ["medic"]}, "attributes": ["patient", "hr"],
        "grant_option": True}
ASK = {"Request": {"Resource": {"Attribute": [{
    "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "bedside"}]},
    "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                              "Value": "read"}]}}}


def entries(m1_roles: list[str]) -> list[dict]:
    return [{"token": TOKENS["nea"], "subject": "nea", "roles": ["data-owner"], "admin": True},
            {"token": TOKENS["m1"], "subject": "medic-1", "roles": m1_roles},
            {"token": TOKENS["m2"], "subject": "medic-2", "roles": ["medic"]}]


def bearer(who: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    auth = data / "auth.json"
    auth.write_text(json.dumps(entries(["medic", "icu"])))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    client = app.test_client()
    assert client.post("/streams", json=BEDSIDE, headers=bearer("nea")).status_code == 201
    r = client.post("/policies", data=json.dumps(RULE), headers={
        **bearer("nea"), "Content-Type": "application/vnd.xsg.rule+json"})
    assert r.status_code == 201, r.get_data(as_text=True)
    yield client, runtime, services, auth
    services.close()


def test_roles_are_in_the_plan_and_a_change_of_them_revokes(gw):
    client, runtime, services, auth = gw
    handles = {}
    for who in ("m1", "m2"):
        r = client.post("/requests", json=ASK, headers={**bearer(who),
                                                        "Content-Type": "application/xacml+json"})
        assert r.status_code == 201, r.get_data(as_text=True)
        handles[who] = r.json["id"]
    assert runtime.attached[handles["m1"]][1].punctuation_roles == ("icu", "medic")
    assert runtime.attached[handles["m2"]][1].punctuation_roles == ("medic",)
    tmp = auth.with_name("auth.json.tmp")
    tmp.write_text(json.dumps(entries(["medic"])))  # icu taken away; still a medic: Permit
    os.replace(tmp, auth)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and \
            services.handle_store.get(handles["m1"]).state is HandleState.LIVE:
        time.sleep(0.01)
    record = services.handle_store.get(handles["m1"])
    assert record.state is HandleState.REVOKED
    assert "roles changed" in record.reason
    assert services.handle_store.get(handles["m2"]).state is HandleState.LIVE


def test_a_handle_on_a_punctuated_stream_cannot_be_re_shared(gw):
    """What a handle gets is what the punctuations show its subject's roles: re-shared as a
    derived stream it would reach roles they exclude. Refused even with the grant option."""
    client, runtime, services, auth = gw
    r = client.post("/requests", json=ASK, headers={**bearer("m2"),
                                                    "Content-Type": "application/xacml+json"})
    assert r.status_code == 201, r.get_data(as_text=True)
    assert r.json.get("grant_option") is True
    r = client.post(f"/handles/{r.json['id']}/derive", headers=bearer("m2"),
                    json={"name": "bedside-copy"})
    assert r.status_code == 422, r.get_data(as_text=True)
    assert "carries security punctuations" in r.json["detail"]


def test_the_one_window_rule_holds_on_a_punctuated_stream(gw):
    """One live query per (subject, stream): the roles the plan carries do not make a second
    query another slot; the same request maps to the same handle."""
    client, runtime, services, auth = gw
    xacml = {**bearer("m2"), "Content-Type": "application/xacml+json"}
    first = client.post("/requests", json=ASK, headers=xacml)
    assert first.status_code == 201, first.get_data(as_text=True)
    again = client.post("/requests", json=ASK, headers=xacml)
    assert again.status_code == 200 and again.json["id"] == first.json["id"]
    other = client.post("/requests", headers=bearer("m2"), data={
        "request": (io.BytesIO(json.dumps(ASK).encode()), "r.json", "application/xacml+json"),
        "query": (io.BytesIO(b'{"filter": "hr > 100"}'), "q.json", "application/json")})
    assert other.status_code == 409, other.get_data(as_text=True)


def test_changed_roles_are_found_in_a_joins_sides_and_a_unions_members():
    """A join's sides and a union's members carry the roles (`shielded_plan`): a change of
    the subject's roles is seen in them as in a plain plan."""
    from common.auth import Identity
    from pep.core.plan import (
        ExecutionPlan,
        Field,
        JoinPlan,
        SourceSpec,
        StreamDefinition,
        StreamSchema,
        UnionPlan,
    )
    from pep.core.punctuations import shielded_plan
    from pep.handles.records import HandleRecord, StoredRequest
    from pep.handles.revocation import _roles_changed
    schema = StreamSchema((Field("patient", "long"), Field("hr", "double")))
    on = StreamDefinition("v", "o", schema, SourceSpec("ingest", (("punctuations", "on"),)))
    off = StreamDefinition("w", "o", schema, SourceSpec("ingest", ()))
    side = ExecutionPlan("v", None, ("patient", "hr"))
    plans = [shielded_plan(JoinPlan(ExecutionPlan("w", None, ("patient", "hr")), side,
                                    (("patient", "patient"),), 5.0, "hr", "hr"), [off, on],
                           ["medic"]),
             shielded_plan(UnionPlan("v", (side, ExecutionPlan("v", None, ("hr",)))), [on],
                           ["medic"])]
    for plan in plans:
        record = HandleRecord("h", "m2", ("medic",), False, "v", plan.canonical_json(),
                              plan.key(), (), StoredRequest(b"{}", "application/json"))
        assert not _roles_changed(record, Identity(subject="m2", roles=("medic",)))
        assert _roles_changed(record, Identity(subject="m2", roles=("medic", "consumer")))
