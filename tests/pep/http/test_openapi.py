"""GET /openapi.json describes every live route, and validates; GET / is the XACML REST home
document, in JSON Home or XML by Accept (issue 11)."""
from __future__ import annotations

import re

from lxml import etree
from openapi_spec_validator import validate

from pep.http.openapi import PDP_RELATION
from tests.pep.conftest import RecordingRuntime, build_gateway


def test_the_document_lists_exactly_the_live_routes_and_is_valid(tmp_path):
    app, services = build_gateway(tmp_path / "data", RecordingRuntime())
    try:
        client = app.test_client()
        r = client.get("/openapi.json")  # no token needed
        assert r.status_code == 200
        doc = r.json
        validate(doc)
        live = set()
        for rule in app.url_map.iter_rules():
            if rule.endpoint == "static" or rule.rule.startswith("/console/static"):
                continue
            path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
            live |= {(path, m.lower()) for m in rule.methods - {"HEAD", "OPTIONS"}}
        described = {(path, m) for path, ops in doc["paths"].items() for m in ops
                     if m in ("get", "post", "put", "patch", "delete")}
        assert described == live
        for path, method in [("/pdp", "post"), ("/requests", "post"), ("/metrics", "get"),
                             ("/handles/{handle_id}", "get"), ("/policies/bulk", "post")]:
            assert (path, method) in described
        pdp = doc["paths"]["/pdp"]["post"]
        assert pdp["summary"] and "default" in pdp["responses"]
        assert doc["paths"]["/handles/{handle_id}"]["get"]["parameters"][0]["name"] == "handle_id"
    finally:
        services.close()


def test_the_home_document_points_at_the_pdp(tmp_path):
    app, services = build_gateway(tmp_path / "data", RecordingRuntime())
    try:
        client = app.test_client()
        r = client.get("/")
        assert r.status_code == 200 and r.content_type.startswith("application/json-home")
        assert r.get_json(force=True)["resources"][PDP_RELATION]["href"] == "/pdp"
        r = client.get("/", headers={"Accept": "application/xml"})
        assert r.content_type.startswith("application/xml")
        root = etree.fromstring(r.data)
        (link,) = root.iter("{http://ietf.org/ns/home-documents}link")
        assert link.get("href") == "/pdp"
        assert client.get("/", headers={"Accept": "image/png"}).status_code == 406
    finally:
        services.close()
