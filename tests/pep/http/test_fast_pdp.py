"""The fast path of POST /pdp gives exactly the answers of the Flask route (pdp.http.api) it
stands in front of: same status, headers and body, for answered requests and refusals alike."""
from __future__ import annotations

import json

import pytest
from werkzeug.test import Client

from pep.http.app import create_app
from pep.http.fast_pdp import FastPdp
from pep.services import build_services
from tests.pdp.api.conftest import (
    LTA_REQUEST_JSON,
    LTA_REQUEST_XML,
    TOKENS,
    make_config,
    xml_request,
)

XML, JSON = "application/xacml+xml", "application/xacml+json"


@pytest.fixture(scope="module")
def apps(tmp_path_factory):
    services = build_services(make_config(tmp_path_factory.mktemp("fast")))
    app = create_app(services=services)
    assert isinstance(app.wsgi_app, FastPdp)
    fast = Client(app)
    plain = Client(app.wsgi_app.app)  # the Flask app without the fast path
    yield app, fast, plain
    services.close()


def bearer(who):
    return {"Authorization": f"Bearer {TOKENS[who]}"}


CASES = [
    ("xml, no Accept", LTA_REQUEST_XML.read_bytes(), {**bearer("lta"), "Content-Type": XML}),
    ("xml to json", LTA_REQUEST_XML.read_bytes(),
     {**bearer("lta"), "Content-Type": XML, "Accept": JSON}),
    ("json, no Accept", LTA_REQUEST_JSON.read_bytes(), {**bearer("lta"), "Content-Type": JSON}),
    ("json to xml", LTA_REQUEST_JSON.read_bytes(),
     {**bearer("lta"), "Content-Type": JSON, "Accept": XML}),
    ("application/json", LTA_REQUEST_XML.read_bytes(),
     {**bearer("lta"), "Content-Type": XML, "Accept": "application/json"}),
    ("text/xml", LTA_REQUEST_JSON.read_bytes(),
     {**bearer("lta"), "Content-Type": JSON, "Accept": "text/xml"}),
    ("charset parameter", LTA_REQUEST_XML.read_bytes(),
     {**bearer("other"), "Content-Type": XML + "; charset=utf-8"}),
    ("wildcard Accept", LTA_REQUEST_XML.read_bytes(),
     {**bearer("lta"), "Content-Type": XML, "Accept": "*/*"}),
    ("q-values", LTA_REQUEST_XML.read_bytes(),
     {**bearer("lta"), "Content-Type": XML, "Accept": f"{XML};q=0.5, {JSON}"}),
    ("unacceptable Accept", LTA_REQUEST_XML.read_bytes(),
     {**bearer("lta"), "Content-Type": XML, "Accept": "image/png"}),
    ("no token", LTA_REQUEST_XML.read_bytes(), {"Content-Type": XML}),
    ("bad token", LTA_REQUEST_XML.read_bytes(),
     {"Authorization": "Bearer nope", "Content-Type": XML}),
    ("bad content type", LTA_REQUEST_XML.read_bytes(),
     {**bearer("lta"), "Content-Type": "text/plain"}),
    ("malformed xml", b"<Request", {**bearer("lta"), "Content-Type": XML}),
    ("malformed json", b"{", {**bearer("lta"), "Content-Type": JSON}),
    ("empty body", b"", {**bearer("lta"), "Content-Type": XML}),
    ("forged subject", xml_request("nea", "weather"), {**bearer("lta"), "Content-Type": XML}),
    ("too large", b"<Request/>" + b" " * (11 * 1024 * 1024),
     {**bearer("lta"), "Content-Type": XML}),
]


@pytest.mark.parametrize("name, body, headers", CASES, ids=[c[0] for c in CASES])
def test_same_answer_as_the_route(apps, name, body, headers):
    app, fast, plain = apps
    before = app.wsgi_app.answered
    a = fast.post("/pdp", data=body, headers=headers)
    b = plain.post("/pdp", data=body, headers=headers)
    assert a.status_code == b.status_code
    assert a.data == b.data
    keep = ("content-type", "content-length", "www-authenticate", "retry-after")
    assert {k.lower(): v for k, v in a.headers.items() if k.lower() in keep} == \
        {k.lower(): v for k, v in b.headers.items() if k.lower() in keep}
    # the fast path answered the successful ones, except those it leaves to the route
    fast_case = a.status_code == 200 and name not in ("wildcard Accept", "q-values")
    assert app.wsgi_app.answered - before == (1 if fast_case else 0)


def test_the_subject_is_the_caller(apps):
    _, fast, _ = apps
    forged = LTA_REQUEST_XML.read_bytes().replace(b">lta<", b">nea<")
    r = fast.post("/pdp", data=forged, headers={**bearer("lta"), "Content-Type": XML,
                                                 "Accept": JSON})
    honest = fast.post("/pdp", data=LTA_REQUEST_XML.read_bytes(),
                       headers={**bearer("lta"), "Content-Type": XML, "Accept": JSON})
    assert json.loads(r.data) == json.loads(honest.data)


def test_other_routes_are_not_touched(apps):
    app, fast, _ = apps
    before = app.wsgi_app.answered
    assert fast.get("/health").status_code == 200
    assert fast.get("/pdp", headers=bearer("lta")).status_code == 405
    assert app.wsgi_app.answered == before
