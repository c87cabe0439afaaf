"""No 500 anywhere (issue 19): a property-based run over every route `/openapi.json` describes,
and the 500s it and the fuzz run found, each pinned.

Schemathesis turns the gateway's own OpenAPI document into requests, valid (positive) and
invalid (negative) by the document, and each is sent to the real gateway app in process (the
real PDP, PAP, catalogue, planner, handles and audit over a temporary data directory; the
recording runtime in place of Spark), as an administrator, a stream owner, a consumer, with no
token and with a wrong one, with assorted Accept headers, with path parameters that name real
streams, policies, handles and events as well as generated ones, and now and then an odd value
(digits int() refuses or reads, numbers past every limit, far dates, deep JSON) in a parameter
or the body; then every odd value goes once into every parameter and body (`sweep`). The
property: no answer is a 5xx, and every refusal is the one error body `{"error": msg,
"status": n}` (a XACML answer where the route answers in XACML). Every failing request is
collected and reported together, with what was sent. The helpers are in `no500.py`.
"""
from __future__ import annotations

import pytest
from werkzeug.test import EnvironBuilder

pytest.importorskip("schemathesis")

import schemathesis

from tests.fuzz.support import LTA_REQUEST_XML, NEA_POLICY_ID
from tests.pep.http import no500
from tests.pep.http.no500 import (
    BODIES,
    CONVERTER,
    XML,
    headers_for,
    report,
    run_schema,
    seed,
    sweep,
)

# no500's fixtures, under their names for pytest: the gateway, and Hypothesis restored after
# these tests (autouse)
no500_gateway = no500.no500_gateway
hypothesis_as_found = no500.hypothesis_as_found
pytestmark = pytest.mark.timeout(240)

EXAMPLES = 12  # per operation and generation mode (4 where only a path varies): ~15 s idle


@pytest.fixture(scope="module")
def gateway(no500_gateway):
    return no500_gateway


def test_deep_json_and_far_dates_are_400_not_500(gateway):
    client = gateway.app.test_client()
    admin = headers_for("admin", None)
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("/events/invalidations/subscribers", "/streams/ships/events"):
        for method in ("post", "delete") if "subscribers" in path else ("post",):
            r = getattr(client, method)(path, data=deep, headers=admin,
                                        content_type="application/json")
            assert r.status_code == 400, (path, r.status_code, r.get_data()[:200])
            assert r.json["status"] == 400 and r.json["error"]
    for since in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        r = client.get("/audit", query_string={"since": since}, headers=admin)
        assert r.status_code == 400 and "'since'" in r.json["error"] \
            and "years 1 to 9999" in r.json["error"], r.json


@pytest.mark.parametrize("path, name, value", [
    ("/audit", "limit", "²"), ("/audit", "after", "٣"), ("/audit", "limit", "1" * 5000),
    ("/events/invalidations", "after", "①"), ("/events/invalidations", "after", "x.²"),
    ("/policies/" + NEA_POLICY_ID, "store_version", "𝟗"),
])
def test_odd_digits_in_query_parameters_are_400_naming_the_parameter(gateway, path, name,
                                                                    value):
    r = gateway.app.test_client().get(path, query_string={name: value},
                                      headers=headers_for("admin", None))
    assert r.status_code == 400, r.get_data()[:300]
    assert f"'{name}'" in r.json["error"] and r.json["status"] == 400


@pytest.mark.parametrize("where", ["header", "last_event_id", "after"])
def test_odd_digits_in_a_resume_position_are_400_naming_where(gateway, where):
    client = gateway.app.test_client()
    answer = client.post("/requests", data=LTA_REQUEST_XML,  # live (the run may release one)
                         headers={**headers_for("consumer", None), "Content-Type": XML})
    assert answer.status_code in (200, 201), answer.get_data()[:500]
    handle = answer.json["id"]
    headers = headers_for("consumer", "application/x-ndjson")
    query = {}
    if where == "header":
        headers["Last-Event-ID"] = "²"
    else:
        query[where] = "٣"
    r = client.get(f"/handles/{handle}", headers=headers, query_string=query)
    assert r.status_code == 400 and r.json["status"] == 400
    assert ("Last-Event-ID" if where == "header" else f"'{where}'") in r.json["error"]


def abandon(app, path: str, headers: dict[str, str]) -> str:
    """Open a stream and close it unread, as a WSGI server does when its client is gone before
    the first byte (werkzeug's test client always reads one item first); returns the status."""
    environ = EnvironBuilder(path=path, headers=headers).get_environ()
    status: list[str] = []
    body = app(environ, lambda line, _headers, exc_info=None: status.append(line))
    body.close()
    return status[0]


def test_abandoned_streams_give_their_places_back(gateway):
    """A reader that goes before its stream's first byte frees its place, on the invalidation
    feed and on a handle: a generator closed before it started never runs its `finally` (at
    the limit: a 503 or a 429 for every new reader)."""
    hub = gateway.services.invalidation
    for _ in range(hub.max_feed_readers + 5):
        assert abandon(gateway.app, "/events/invalidations",
                       headers_for("admin", "text/event-stream")).startswith("200")
    assert hub.stats()["feed_readers"] == 0
    seed(gateway)
    readers = gateway.app.blueprints["xsg_handles"].readers
    handle = gateway.known["handle_id"][0]
    for accept in ("application/x-ndjson", "text/event-stream") * (readers.per_subject + 5):
        assert abandon(gateway.app, f"/handles/{handle}",
                       headers_for("consumer", accept)).startswith("200")
    assert readers.count("lta") == 0


def test_no_route_of_the_gateway_answers_5xx_or_an_odd_error_body(gateway):
    seed(gateway)
    schema = schemathesis.openapi.from_wsgi("/openapi.json", gateway.app)
    labels = {r.ok().label for r in schema.get_all_operations()}
    routes = {m + " " + CONVERTER.sub(r"{\1}", rule.rule)
              for rule in gateway.app.url_map.iter_rules()
              for m in rule.methods - {"HEAD", "OPTIONS"}
              if rule.endpoint != "static" and not rule.rule.startswith("/console/static")}
    # the run reaches every route of the app (schemathesis leaves out the document it read)
    assert labels == routes - {"GET /openapi.json"} and len(routes) >= 30
    failures, answered = run_schema(schema, gateway.app, gateway.known, EXAMPLES, BODIES)
    odd, sent = sweep(schema, gateway.app, gateway.known)
    assert not failures + odd, report(failures + odd)
    assert sent > 500
    # it reached past the first checks: successes, refusals and not-founds all occurred
    assert answered.get("2xx", 0) > 100 and answered.get("4xx", 0) > 500, answered
