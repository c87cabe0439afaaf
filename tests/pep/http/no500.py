"""No 500 anywhere (issue 19): what the property-based runs over every route share (the tests
are tests/pep/http/test_no_500.py for the gateway and tests/proxy/test_no_500.py for the proxy).

Schemathesis turns the gateway's own OpenAPI document into requests, valid (positive) and
invalid (negative) by the document, and each is sent to the real gateway app in process (the
real PDP, PAP, catalogue, planner, handles and audit over a temporary data directory; the
recording runtime in place of Spark), as an administrator, a stream owner, a consumer, with no
token and with a wrong one, with assorted Accept headers, with path parameters that name real
streams, policies, handles and events as well as generated ones. The property: no answer is a
5xx, and every refusal is the one error body `{"error": msg, "status": n}` (a XACML answer where
the route answers in XACML). The same run goes through the caching proxy, in front of the same
gateway served over HTTP, and the proxy's own routes get a hypothesis run of their own.

Every failing request of a run is collected and reported together, with what was sent.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode
from werkzeug.test import Client

from common.auth import write_auth_file
from tests.fuzz.support import (
    LTA_REQUEST_JSON,
    LTA_REQUEST_XML,
    NEA_POLICY,
    NEA_POLICY_ID,
    SHIPS,
    SHIPS_POLICY,
    SHIPS_POLICY_ID,
    WEATHER,
)
from tests.pep.conftest import RecordingRuntime, build_gateway

# JSON lines (POST /streams/<name>/records) go as the text they are
schemathesis.serializer.alias("application/x-ndjson", "text/plain")

# What schemathesis patches in Hypothesis, process-wide, the first time it builds a strategy
# (schemathesis.generation.hypothesis.setup: a 32 KiB buffer instead of 8, no printing of
# failing examples, ...): (module, attribute) pairs.
_PATCHED_IN_HYPOTHESIS = (
    ("hypothesis.core", "RepresentationPrinter"), ("hypothesis.core", "BUFFER_SIZE"),
    ("hypothesis.internal.conjecture.engine", "BUFFER_SIZE"),
    ("hypothesis.strategies._internal.collections", "BUFFER_SIZE"),
    ("hypothesis.strategies._internal.core", "is_first_param_referenced_in_function"),
    ("hypothesis.internal.entropy", "register_random"))


@pytest.fixture(scope="module", autouse=True)
def hypothesis_as_found() -> Iterator[None]:
    """The tests after these get Hypothesis back as it was (the rest of the suite runs in the
    same process, with its own Hypothesis tests)."""
    import importlib

    from schemathesis.generation import hypothesis as patcher

    saved = [(importlib.import_module(m), a, getattr(importlib.import_module(m), a, None))
             for m, a in _PATCHED_IN_HYPOTHESIS]
    was_patched = getattr(patcher.setup, "_is_patched", False)
    yield
    if was_patched:
        return  # patched before these tests: nothing of theirs to undo
    for module, attribute, value in saved:
        if value is not None:
            setattr(module, attribute, value)
    patcher.setup._is_patched = False  # type: ignore[attr-defined]

TOKENS = {"admin": "tok-no500-admin-0123456789", "owner": "tok-no500-owner-0123456789",
          "consumer": "tok-no500-lta-0123456789"}
CALLERS = (*TOKENS, *TOKENS, "anonymous", "wrong-token")  # an identity three times in four
ACCEPTS = (None, "application/json", "text/event-stream", "application/x-ndjson",
           "application/xacml+xml", "application/xacml+json", "*/*", "image/png",
           "text/html;q=0, application/json;q=0.5", "\u00e9/\u00e9")
XML = "application/xacml+xml"
XACML_TYPES = ("application/xacml+xml", "application/xacml+json", "application/xml",
               "text/xml")
STREAMING = ("text/event-stream", "application/x-ndjson")
CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def headers_for(caller: str, accept: str | None) -> dict[str, str]:
    headers = {}
    if caller in TOKENS:
        headers["Authorization"] = f"Bearer {TOKENS[caller]}"
    elif caller == "wrong-token":
        headers["Authorization"] = "Bearer not-a-token-\u00b2\u2460"
    if accept is not None:
        headers["Accept"] = accept
    return headers


# -- the gateway, with something behind every kind of path parameter ----------------------------

@dataclass
class Gateway:
    app: Any
    services: Any
    known: dict[str, list[str]] = field(default_factory=dict)  # path parameter -> real values


def _check(response, *expected: int) -> dict:
    assert response.status_code in (expected or (201,)), response.get_data(as_text=True)[:500]
    return response.get_json(silent=True) or {}


SHIPCO_POLICY = SHIPS_POLICY.replace(b">nea<", b">shipco<")  # the owner's, on the owner's stream


def seed(gateway: Gateway) -> None:
    """Something behind every kind of path parameter: two streams (one the administrator's,
    one the owner's), a policy on each, an event, a record, and a live handle of the consumer.
    Idempotent: a run deletes policies and releases handles, the next one gets them back."""
    client = gateway.app.test_client()
    admin, owner, consumer = (headers_for(c, None) for c in ("admin", "owner", "consumer"))
    _check(client.post("/streams", json=WEATHER, headers=admin), 201, 409)
    _check(client.post("/streams", json=SHIPS, headers=owner), 201, 409)
    _check(client.post("/policies", data=NEA_POLICY, headers={**admin, "Content-Type": XML}),
           201, 409)
    _check(client.post("/policies", data=SHIPCO_POLICY,
                       headers={**owner, "Content-Type": XML}), 201, 409)
    _check(client.post("/streams/ships/events", headers=owner, json={
        "name": "windy", "condition": "windspeed > 20", "hold": 60}), 201, 409)
    record = {f["name"]: 1.5 for f in WEATHER["schema"]}
    record.update(samplingtime="2024-01-01T00:00:00Z", winddirection=90)
    _check(client.post("/streams/weather/records", headers=admin, data=json.dumps(record),
                       content_type="application/x-ndjson"))
    handle = _check(client.post("/requests", data=LTA_REQUEST_XML,
                                headers={**consumer, "Content-Type": XML}), 200, 201)
    gateway.known.update(
        name=["weather", "ships"], policy_id=[NEA_POLICY_ID, SHIPS_POLICY_ID],
        handle_id=[handle["id"]], event=["windy"], path=["requests", "handles"])


@pytest.fixture(scope="module")
def no500_gateway(tmp_path_factory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("no500") / "data"
    data.mkdir(parents=True)
    write_auth_file(data / "auth.json", [
        {"token": TOKENS["admin"], "subject": "nea", "roles": ["data-owner"], "admin": True},
        {"token": TOKENS["owner"], "subject": "shipco", "roles": ["data-owner"],
         "admin": False},
        {"token": TOKENS["consumer"], "subject": "lta", "roles": ["consumer"], "admin": False},
    ])
    app, services = build_gateway(data, RecordingRuntime())
    running = Gateway(app, services)
    seed(running)
    yield running
    services.close()


# real documents for the routes that read one, beside the generated ones (positive mode)
XACML_REQUESTS = [(XML, LTA_REQUEST_XML), ("application/xacml+json", json.loads(LTA_REQUEST_JSON))]
BODIES: dict[str, list[tuple[str, Any]]] = {
    "POST /pdp": XACML_REQUESTS,
    "POST /explain": XACML_REQUESTS,
    "POST /requests": XACML_REQUESTS,
    "POST /policies": [(XML, NEA_POLICY), (XML, SHIPCO_POLICY)],
    "PUT /policies/{policy_id}": [(XML, NEA_POLICY)],
    "POST /streams": [("application/json", {**WEATHER, "name": "weather2"}),
                      ("application/json", {**SHIPS, "name": "ships2", "source": {
                          "kind": "generator", "schema": "weather", "rate": "٣"}})],
    "POST /streams/{name}/events": [("application/json", {
        "name": "calm", "condition": "windspeed < 1", "hold": 30})],
    "POST /streams/{name}/records": [("application/x-ndjson", json.dumps(
        {"samplingtime": "2024-01-01T00:00:01Z", "rainrate": 1.0, "windspeed": 2.0,
         "winddirection": 3, "temperature": 1.0, "humidity": 1.0, "solarradiation": 1.0,
         "barometer": 1.0}).encode())],
    "POST /events/invalidations/subscribers": [("application/json",
                                                {"webhook": "http://127.0.0.1:9/hook"})],
}


# -- the run --------------------------------------------------------------------------------------

@dataclass
class Failure:
    operation: str
    caller: str
    status: int | str
    request: dict
    answer: str

    def __str__(self) -> str:
        sent = {k: v for k, v in self.request.items() if v not in (None, {}, "", b"")}
        shown = json.dumps(sent, default=repr)[:600]
        return f"{self.operation} as {self.caller}: {self.status}\n    sent {shown}\n    " \
               f"got {self.answer[:400]}"


def error_body_problem(status: int, content_type: str, body: bytes) -> str | None:
    """What is wrong with a refusal's body, or None: the one JSON error body, or XACML."""
    if any(t in content_type for t in XACML_TYPES):
        return None  # a XACML answer (POST /pdp's syntax errors, denials in XACML)
    try:
        doc = json.loads(body)
    except ValueError:
        return f"not JSON ({content_type or 'no Content-Type'})"
    if isinstance(doc, dict) and isinstance(doc.get("Response"), list):
        return None  # a XACML answer in the JSON Profile, which application/json also asks for
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), str) or not doc["error"]:
        return "no 'error' message"
    if doc.get("status") != status:
        return f"'status' is {doc.get('status')!r}, not {status}"
    return None


def on_the_wire(headers: dict[str, str]) -> dict[str, str]:
    """Header values as a WSGI server hands them to the app: text beyond Latin-1 travels as its
    UTF-8 bytes, which the server decodes as Latin-1 (PEP 3333); a line break cannot be in a
    header at all (it would end it), and spaces around a value are not part of it (RFC 9110
    5.5). The test client would pass such text on as it is,
    which no server does."""
    out = {}
    for name, value in headers.items():
        value = value.replace("\r", " ").replace("\n", " ").strip(" \t")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "surrogatepass").decode("latin-1")
        out[name] = value
    return out


def send(client: Client, kwargs: dict) -> tuple[int, str, bytes]:
    """The answer to one request; a streamed answer is closed after its status (a reader that
    goes away), so that an endless stream ends the case instead of the test."""
    kwargs = {**kwargs, "headers": on_the_wire(kwargs.get("headers") or {})}
    response = client.open(buffered=False, **kwargs)
    try:
        content_type = response.headers.get("Content-Type", "")
        if response.status_code < 400 and any(t in content_type for t in STREAMING):
            return response.status_code, content_type, b""
        return response.status_code, content_type, response.get_data()
    finally:
        response.close()


def shared_feedback(schema) -> Any:
    """What schemathesis learns from the schema and the app's code (constants worth trying),
    built once for the run rather than once per strategy (it reads the app's source files)."""
    try:
        from schemathesis.generation.feedback import FeedbackSources
        from schemathesis.python._constants.orchestrator import make_constants_value_source
    except ImportError:  # another schemathesis: each strategy builds its own
        return None
    return FeedbackSources(constants_value_source=make_constants_value_source(schema))


# What a client can write where a number, a date or a document is expected, that a schema's
# own negative cases seldom reach: digits int() refuses or reads ('²', '٣'), digit runs past
# every limit, NaN, the far ends of the calendar in a time zone that overflows, empty text.
ODD_VALUES = ("²", "٣", "①", "𝟗", "1" * 5000, "9" * 30, str(2 ** 63), "-1", "-0", "+1",
              "1_000", "0x10", "1e999", "nan", "Infinity", "", " ", "0001-01-01T00:00:00+14:00",
              "9999-12-31T23:59:59-14:00", "2024-02-30", "x.²", "epoch.99999999999999999999")
DEEP_BODIES = (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
               b'{"name": "x", "hold": 1e999}', b'{"webhook": "\\ud800"}', b"\xff\xfe\x00")


def mutate(kwargs: dict, operation, data) -> dict:
    """Now and then, an odd value in one parameter, or an odd body, in an otherwise generated
    request (a third of the time)."""
    choice = data.draw(st.sampled_from(("keep", "keep", "parameter", "body")), label="mutation")
    if choice == "parameter":
        names = [("query_string", p.name) for p in operation.query] + \
            [("headers", p.name) for p in operation.headers]
        if names:
            where, name = data.draw(st.sampled_from(names), label="parameter")
            value = data.draw(st.sampled_from(ODD_VALUES), label="value")
            current = kwargs.get(where) or {}
            if isinstance(current, str):  # a query schemathesis wrote out itself
                kwargs[where] = f"{current}&{quote(name)}={quote(value)}".lstrip("&")
            else:
                kwargs[where] = {**current, name: value}
    elif choice == "body" and operation.body:
        kwargs.pop("json", None)
        kwargs["data"] = data.draw(st.sampled_from(DEEP_BODIES), label="body")
        media = [b.media_type for b in operation.body]
        kwargs["headers"] = {**kwargs["headers"],
                             "Content-Type": data.draw(st.sampled_from(media), label="type")}
    return kwargs


def evenly(strategies: list) -> st.SearchStrategy:
    """Each strategy equally often (st.one_of favours the first: the real documents and names,
    listed after the generated ones, would hardly be drawn)."""
    return st.sampled_from(range(len(strategies))).flatmap(lambda i: strategies[i])


def _plain(operation) -> bool:
    """An operation with nothing to generate but its path: a few examples say all."""
    return not (operation.query or operation.headers or operation.body)


def _one_case(client: Client, operation, label: str, strategies: list, examples: int,
              failures: list[Failure], answered: dict[str, int]) -> Callable[[], None]:
    """The hypothesis test of one operation: each generated case sent to `client`, its 5xx and
    bad error bodies added to `failures`, its status class counted in `answered`."""
    @settings(max_examples=4 if _plain(operation) else 2 * examples, deadline=None,
              derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(case=evenly(strategies), caller=st.sampled_from(CALLERS),
           accept=st.sampled_from(ACCEPTS), data=st.data())
    def one(case, caller, accept, data):
        kwargs = case.as_transport_kwargs(headers=headers_for(caller, accept))
        kwargs.pop("base_url", None)
        media = case.media_type or ""
        if isinstance(case.body, str) and "json" not in media \
                and not media.startswith("multipart/"):
            # the text itself: an XML document, JSON lines (schemathesis would wrap a
            # string in an XML element of its own)
            kwargs["data"] = case.body.encode("utf-8", "surrogatepass")
        kwargs = mutate(kwargs, operation, data)
        try:
            status, content_type, body = send(client, kwargs)
        except Exception as exc:  # noqa: BLE001 - an exception out of the app is a 500
            failures.append(Failure(label, caller, type(exc).__name__, kwargs, repr(exc)))
            return
        answered[f"{status // 100}xx"] = answered.get(f"{status // 100}xx", 0) + 1
        if status >= 500:
            failures.append(Failure(label, caller, status, kwargs,
                                    body.decode("utf-8", "replace")))
        elif status >= 400:
            problem = error_body_problem(status, content_type, body)
            if problem is not None:
                failures.append(Failure(label, caller, f"{status}: {problem}", kwargs,
                                        body.decode("utf-8", "replace")))

    return one


def run_schema(schema, app, known: dict[str, list[str]], examples: int,
               bodies: dict[str, list[tuple[str, Any]]] | None = None,
               skip: Callable[[str], bool] = lambda label: False) -> tuple[list[Failure], dict]:
    """Every operation of `schema`, in both generation modes, sent to `app`: the failures, and
    how many requests were answered with each status class. Path parameters are generated or
    taken from `known` (real names), bodies generated or, for the positive mode, taken from
    `bodies` (label -> [(media type, body)], real documents)."""
    client = Client(app)
    failures: list[Failure] = []
    answered: dict[str, int] = {}
    feedback = shared_feedback(schema)
    for result in schema.get_all_operations():
        operation = result.ok()
        label = operation.label
        if skip(label):
            continue
        names = [p.name for p in operation.path_parameters]
        real_paths = [{n: known[n][i % len(known[n])] for n in names}
                      for i in range(max(len(known.get(n, ())) for n in names))] \
            if names and all(n in known for n in names) else []
        strategies = []
        modes = (GenerationMode.POSITIVE,) if _plain(operation) \
            else (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        for mode in modes:
            strategies.append(operation.as_strategy(generation_mode=mode, feedback=feedback))
            strategies += [operation.as_strategy(generation_mode=mode, path_parameters=p,
                                                     feedback=feedback)
                           for p in real_paths]
            if mode is GenerationMode.POSITIVE:
                strategies += [operation.as_strategy(generation_mode=mode, body=body,
                                                     media_type=media, path_parameters=p,
                                                     feedback=feedback)
                               for media, body in (bodies or {}).get(label, ())
                               for p in real_paths or [None]]

        try:
            _one_case(client, operation, label, strategies, examples, failures, answered)()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            pass
    return failures, answered


def sweep(schema, app, known: dict[str, list[str]], skip: Callable[[str], bool]
          = lambda label: False) -> tuple[list[Failure], int]:
    """Every odd value in every query and header parameter, and every odd body under every
    media type an operation reads, once, as an administrator and as an owner: what a random
    run may miss."""
    client = Client(app)
    failures: list[Failure] = []
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        label = operation.label
        if skip(label):
            continue
        path = operation.path
        for p in operation.path_parameters:
            path = path.replace("{" + p.name + "}", quote(known.get(p.name, ["x"])[0], safe=""))
        requests: list[dict] = []
        for where, params in (("query_string", operation.query), ("headers", operation.headers)):
            for p in params:
                requests += [{where: {p.name: value}} for value in ODD_VALUES]
        for body in operation.body:
            requests += [{"data": data, "headers": {"Content-Type": body.media_type}}
                         for data in DEEP_BODIES]
        for caller in ("admin", "owner"):  # a consumer is mostly refused before parameters
            for extra in requests:
                kwargs = {"method": operation.method.upper(), "path": path,
                          **extra, "headers": {**headers_for(caller, None),
                                               **extra.get("headers", {})}}
                status, content_type, body = send(client, kwargs)
                sent += 1
                problem = "5xx" if status >= 500 else \
                    error_body_problem(status, content_type, body) if status >= 400 else None
                if problem is not None:
                    failures.append(Failure(label, caller, f"{status}: {problem}", kwargs,
                                            body.decode("utf-8", "replace")))
    return failures, sent


def report(failures: list[Failure]) -> str:
    seen: dict[tuple, Failure] = {}
    for f in failures:
        seen.setdefault((f.operation, str(f.status)[:3]), f)
    return f"{len(failures)} bad answers; one of each kind:\n" + "\n".join(
        str(f) for f in seen.values())
