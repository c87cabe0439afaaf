"""End-to-end fixtures: ONE SparkSession and ONE gateway over its HTTP server for the whole run.

The gateway is the real thing (pep.services + pep.http.app + StreamRuntime on Spark), served by
server.serving.HttpServer on a free loopback port; tests talk to it with `requests`.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.pep.conftest import TOKENS, build_gateway

POLICIES = Path(__file__).resolve().parents[2] / "policies"


@dataclass
class Gateway:
    url: str
    app: object
    services: object
    server: object
    runtime: object

    def close(self) -> None:
        # Streaming readers first: their responses end only when their handles' buffers
        # close, and the server's stop waits for its workers.
        self.services.close_stream_side()
        self.server.stop()
        self.services.close()


def start_gateway(spark, data_dir: Path) -> Gateway:
    from pep.runtime.runtime import StreamRuntime
    from server.serving import HttpServer

    runtime = StreamRuntime(spark, data_dir / "runtime", trigger_interval=0.25)
    app, services = build_gateway(data_dir, runtime, heartbeat=1.0, interval=0.5)
    server = HttpServer(app, host="127.0.0.1", port=0, threads=16)
    server.start()
    return Gateway(server.url, app, services, server, runtime)


@pytest.fixture(scope="session")
def gateway(spark, tmp_path_factory):
    gw = start_gateway(spark, tmp_path_factory.mktemp("gateway"))
    yield gw
    gw.close()


@contextmanager
def added_subjects(gateway: Gateway, subjects: dict[str, dict]) -> Iterator[None]:
    """The gateway's auth file with `subjects` added while the block runs (subject: what its
    entry holds beside its token and `admin: false`, its roles and attributes), each with the
    token `tok-<subject>-0123456789`, which `auth` knows meanwhile. Enters once the gateway has
    re-read the file (15 s at the most); puts the file and the tokens back at the end."""
    auth_file = Path(gateway.services.config.effective_auth_file)
    original = auth_file.read_bytes()
    entries = json.loads(original)
    for subject, entry in subjects.items():
        TOKENS[subject] = f"tok-{subject}-0123456789"
        entries.append({"token": TOKENS[subject], "subject": subject, "admin": False, **entry})
    auth_file.write_text(json.dumps(entries))
    try:
        last = list(subjects)[-1]
        deadline = time.monotonic() + 15
        while requests.get(f"{gateway.url}/streams", headers=auth(last),
                           timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the auth file was not re-read"
            time.sleep(0.1)
        yield
    finally:
        auth_file.write_bytes(original)
        for subject in subjects:
            TOKENS.pop(subject, None)


def bearer(token: str, **extra: str) -> dict:
    """Headers that authenticate with `token` (a test's own subject), `extra` beside."""
    return {"Authorization": f"Bearer {token}", **extra}


def auth(who: str, **extra) -> dict:
    """Headers that authenticate as `who`, one of the suite's subjects (tests.pep.conftest)."""
    return bearer(TOKENS[who], **extra)


STRING = "http://www.w3.org/2001/XMLSchema#string"
INTEGER = "http://www.w3.org/2001/XMLSchema#integer"
RESOURCE = ("urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
            "urn:oasis:names:tc:xacml:1.0:resource:resource-id")
SUBJECT = ("urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
           "urn:oasis:names:tc:xacml:1.0:subject:subject-id")


def match(category: str, attribute: str, value: str) -> str:
    """A XACML Match: the (category, attribute) designated equals the string `value`."""
    return (f'<Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">'
            f'<AttributeValue DataType="{STRING}">{value}</AttributeValue>'
            f'<AttributeDesignator Category="{category}" AttributeId="{attribute}" '
            f'MustBePresent="false" DataType="{STRING}"/></Match>')


def window_policy(stream: str, kind: str, size: int, step: int, aggregates: tuple[str, ...],
                  **options: str) -> bytes:
    """A policy that gives `stream` to everyone as windows (obligation `stream-window`): `kind`
    "tuple" or "time", `size` and `step` (tuples or seconds), `aggregates` ("attr:fn" each);
    `options`, the window's further attributes as text by the middle of their id
    (dp_epsilon="0.5": `stream-window-dp-epsilon-id`)."""
    def assign(attr: str, value: str, dtype: str = STRING) -> str:
        return (f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{attr}">'
                f'<AttributeValue DataType="{dtype}">{value}</AttributeValue>'
                "</AttributeAssignmentExpression>")
    assigned = [assign("stream-window-type-id", kind),
                assign("stream-window-size-id", str(size), INTEGER),
                assign("stream-window-step-id", str(step), INTEGER),
                *(assign("stream-window-attr-id", a) for a in aggregates),
                *(assign(f"stream-window-{k.replace('_', '-')}-id", v) for k, v in options.items())]
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="urn:t:{stream}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf>{match(*RESOURCE, stream)}</AllOf></AnyOf></Target>
      <Rule RuleId="all" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-window" FulfillOn="Permit">
          {"".join(assigned)}
        </ObligationExpression></ObligationExpressions></Rule></Policy>""".encode()


def read_request(stream: str) -> bytes:
    """A XACML request to read `stream` (its resource-id, action `read`)."""
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  ReturnPolicyIdList="false" CombinedDecision="false">
  <Attributes Category="{RESOURCE[0]}"><Attribute AttributeId="{RESOURCE[1]}"
    IncludeInResult="false"><AttributeValue DataType="{STRING}">{stream}</AttributeValue>
  </Attribute></Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:action"><Attribute
    AttributeId="urn:oasis:names:tc:xacml:1.0:action:action-id" IncludeInResult="false">
    <AttributeValue DataType="{STRING}">read</AttributeValue></Attribute></Attributes>
</Request>""".encode()


FINAL = ("revoked", "released", "ended", "shutdown")  # a handle's last line on a connection


@dataclass
class Reader:
    """Reads a handle's NDJSON in a background thread, like a consumer's application: one
    response, until its final event. With `resume`, as `xsg_client` does: after a broken
    connection or `shutdown`, again with Last-Event-ID (a 503 waits its Retry-After), until
    another final event, another refusal or `stop`."""

    url: str
    who: str = "lta"
    token: str | None = None  # a bearer token of the test's own; None: the suite's of `who`
    last_event_id: int | None = None  # sent on the first request; then the last line's id
    resume: bool = False
    timeout: float | tuple[float, float] = 60  # requests' (connect, read) time-outs
    lines: list = field(default_factory=list)
    arrived: list = field(default_factory=list)  # time.monotonic() of each line's arrival
    status: int | None = None  # the last response's status
    statuses: list = field(default_factory=list)  # each response's, "broken" for a broken one
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    final: dict | None = None
    final_at: float | None = None

    def start(self) -> Reader:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.resume:
                    self._read()
                    return
                try:
                    again = self._read()
                except (requests.ConnectionError, requests.Timeout,
                        requests.exceptions.ChunkedEncodingError):
                    self.statuses.append("broken")
                    time.sleep(0.2)
                    continue
                if not again:
                    return
        finally:
            self.done.set()

    def _read(self) -> bool:
        """One response, read to its end; whether to read again (`resume`)."""
        headers = (bearer(self.token, Accept="application/x-ndjson") if self.token
                   else auth(self.who, Accept="application/x-ndjson"))
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = str(self.last_event_id)
        with requests.get(self.url, headers=headers, stream=True, timeout=self.timeout) as r:
            self.status = r.status_code
            self.statuses.append(r.status_code)
            if r.status_code == 503 and self.resume:
                time.sleep(float(r.headers.get("Retry-After", "1")))
                return True
            if r.status_code != 200:
                return False
            for raw in r.iter_lines(chunk_size=1):
                if not raw:
                    continue
                obj = json.loads(raw)
                if obj.get("event") == "heartbeat":
                    continue
                self.lines.append(obj)
                self.arrived.append(time.monotonic())
                if "id" in obj:
                    self.last_event_id = obj["id"]
                if obj.get("event") == "shutdown" and self.resume:
                    return True  # the stream moved: read again wherever it is now
                if obj.get("event") in FINAL:
                    self.final, self.final_at = obj, self.arrived[-1]
                    return False
        return self.resume

    @property
    def rows(self) -> list[dict]:
        return [x["row"] for x in self.lines if "row" in x]

    @property
    def events(self) -> list[tuple[float, dict]]:
        """(arrival, line) of every line so far."""
        return list(zip(self.arrived, self.lines, strict=False))

    def kinds(self) -> list[str]:
        """Each line's kind in order: its event, or "row"."""
        return [x.get("event", "row") for x in self.lines]

    def wait(self, until: Callable[[], bool], timeout: float = 60) -> bool:
        """Whether `until()` came true within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            time.sleep(0.05)
        return bool(until())

    def wait_rows(self, n: int, timeout: float = 90) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.rows) < n and time.monotonic() < deadline and not self.done.is_set():
            time.sleep(0.05)
        return self.rows
