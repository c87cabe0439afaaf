"""A stream's query that stalls is told to the readers an edge serves (issue 45), as the
gateway tells its own (tests/e2e/test_stall_alarms.py): a gateway in this process with
delivery through the session's broker and a PostgreSQL store, a short stall bound (2 s) and
its stall checks every 0.1 s; an edge in this process (its node and its HTTP app); a reader
over NDJSON. The stall is made real as in one process: a delivery that does not return holds
the stream's next micro-batch back, with input waiting behind it. The reader gets `stalled`,
an edge started during the stall tells its new reader `stalled` first (it reads the store),
and both get `resumed` once the batch goes on, then every row once (by event id)."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.e2e.conftest import Gateway, Reader, auth
from tests.e2e.test_stall_alarms import POLICY, REQUEST, STALL, STREAM, XML, append
from tests.pep.conftest import write_auth

pytestmark = pytest.mark.timeout(240)


class Edge:
    """An edge in this process: its node and its HTTP server."""

    def __init__(self, config, name: str) -> None:
        from common.db import open_storage
        from common.oidc.composite import build_authenticator
        from pep.delivery.settings import DeliverySettings
        from pep.delivery.store import DeliveryStore
        from pep.edge.node import EdgeNode
        from pep.handles.records import HandleStore
        from pep.http.edge import create_edge_app
        from pep.http.read_tokens import ReadTokens
        from server.serving import HttpServer

        self.storage = open_storage(config.data_dir, config.store, pool_size=2)
        self.node = EdgeNode(DeliverySettings.of(config),
                             DeliveryStore(self.storage.database("delivery")), name)
        authenticator = build_authenticator(config.auth_file)
        key = HandleStore(self.storage.database("handles")).shared_key("read_token_key")
        app = create_edge_app(self.node, authenticator, ReadTokens(
            key, 60, lambda: authenticator.identities), 0.5, 10)
        self.server = HttpServer(app, host="127.0.0.1", port=0, threads=4)
        self.server.start()
        self.node.start(self.server.url)
        self.url = self.server.url

    def close(self) -> None:
        self.node.stop()
        self.server.stop()
        self.storage.close()


def notices(reader: Reader, after: int = 0) -> list[str]:
    """The kinds of the stream notices a reader got (after its first `after` events)."""
    return [k for k in reader.kinds()[after:] if k in ("stalled", "resumed")]


@pytest.fixture(scope="module")
def gateway(spark, kafka_broker, postgres, tmp_path_factory):
    from pep.config import GatewayConfig
    from pep.delivery.settings import DeliverySettings
    from pep.http.app import create_app
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from pep.services import build_services
    from server.serving import HttpServer

    data_dir = tmp_path_factory.mktemp("stall-edges")
    write_auth(data_dir / "auth.json")
    config = GatewayConfig(
        data_dir=data_dir, auth_file=data_dir / "auth.json", policies_dir=None, port=0,
        heartbeat=0.5, reevaluation_interval=0.1, store=postgres.new_url(), delivery="kafka",
        delivery_brokers=kafka_broker.bootstrap, delivery_security_protocol="PLAINTEXT",
        delivery_topic_prefix=f"st{int(time.time() * 1000) % 1000000}.")
    runtime = StreamRuntime(spark, data_dir / "runtime", settings=RuntimeSettings(
        trigger_interval=0.25, stall_seconds=STALL, janitor_interval=0.2,
        delivery=DeliverySettings.of(config)))
    services = build_services(config, runtime=runtime)
    server = HttpServer(create_app(services=services), host="127.0.0.1", port=0, threads=8)
    server.start()
    gw = Gateway(server.url, None, services, server, runtime)
    gw.config = config
    edges: list[Edge] = []
    gw.edges = edges
    try:
        yield gw
    finally:
        for edge in edges:
            edge.close()
        gw.close()


def test_a_stall_is_told_to_an_edges_readers_and_to_an_edge_started_during_it(gateway):
    from pep.core.plan import ExecutionPlan

    gw, base = gateway, gateway.url
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": STREAM, "source": {"kind": "ingest"}, "schema": [{"name": "v",
                                                                  "type": "double"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=POLICY, timeout=30)
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML), data=REQUEST, timeout=120)
    assert r.status_code == 201, r.text
    handle = r.json()["id"]
    gw.edges.append(Edge(gw.config, "edge-a"))
    reader = Reader(f"{gw.edges[0].url}/handles/{handle}").start()
    append(base, 1.0)
    assert reader.wait(lambda: len(reader.rows) == 1, 90), reader.lines
    # a first micro-batch slower than the bound on a loaded machine is a stall too (told and
    # resumed): what follows is counted from when the stream runs
    assert reader.wait(lambda: STREAM not in gw.services.stall_notices.troubled()
                       and reader.kinds().count("stalled") == reader.kinds().count("resumed"),
                       30), reader.lines
    mark = len(reader.lines)

    release, blocked = threading.Event(), threading.Event()

    def stuck(batch) -> bool:
        blocked.set()
        release.wait(60)
        return True

    gw.runtime.attach_handle("stuck", gw.services.catalog.get(STREAM),
                             ExecutionPlan(STREAM, None, ("v",)), stuck)
    try:
        append(base, 2.0)
        assert blocked.wait(60)
        append(base, 3.0)  # waits behind the batch whose delivery is stuck
        # from here on no batch completes until `release`: the stall the gateway sees now
        # lasts (a slow batch before, such as the query's restart for the new plan, may have
        # been told and resumed already)
        assert reader.wait(lambda: STREAM in gw.services.stall_notices.troubled(), 30)
        assert reader.wait(lambda: notices(reader)[-1:] == ["stalled"], 30), reader.lines
        stalled = [e for e in reader.lines if e.get("event") == "stalled"][-1]
        assert stalled["stream"] == STREAM and stalled["state"] == "stalled", stalled
        assert set(stalled) <= {"id", "event", "stream", "state", "last_batch_at", "detail"}
        # an edge that starts during the stall learns it from the store
        gw.edges.append(Edge(gw.config, "edge-b"))
        late = Reader(f"{gw.edges[1].url}/handles/{handle}").start()
        assert late.wait(lambda: "stalled" in late.kinds(), 30), late.lines
        assert late.kinds()[0] == "stalled", late.lines
    finally:
        release.set()
    assert reader.wait(lambda: "resumed" in reader.kinds()[mark:] and len(reader.rows) == 3,
                       60), reader.lines
    assert late.wait(lambda: "resumed" in late.kinds() and len(late.rows) == 3, 60), \
        late.lines
    time.sleep(1.0)  # nothing more comes
    kinds = notices(reader, mark)
    assert kinds and kinds == ["stalled", "resumed"] * (len(kinds) // 2), kinds
    assert "gap" not in reader.kinds(), reader.lines
    assert [r["v"] for r in reader.rows] == [1.0, 2.0, 3.0], reader.lines
    ids = [e["id"] for e in reader.lines if "row" in e]
    assert ids == sorted(set(ids)), ids  # no row repeated
    assert notices(late) == ["stalled", "resumed"], late.lines
    assert [r["v"] for r in late.rows] == [1.0, 2.0, 3.0], late.lines
    gw.runtime.detach("stuck")
