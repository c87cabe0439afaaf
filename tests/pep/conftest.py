"""Shared pieces for the pure-Python stream-side tests (no Spark)."""
from __future__ import annotations

import threading

import pytest

from pep.core.plan import ExecutionPlan


class RecordingRuntime:
    """Stands in for the Spark runtime in pure-Python tests: remembers attached deliver
    callbacks so a test can push rows exactly as a micro-batch thread would."""

    def __init__(self, fail: bool = False) -> None:
        self.attached: dict[str, tuple] = {}
        self.detached: list[str] = []
        self.fail = fail
        self.lock = threading.Lock()

    def attach_handle(self, handle_id, stream, plan, deliver):
        if self.fail:
            raise RuntimeError("no executors")
        with self.lock:
            self.attached[handle_id] = (stream, plan, deliver)

    def attach_join(self, handle_id, streams, plan, deliver):  # `pep.ports.JoinRuntimePort`
        self.attach_handle(handle_id, streams, plan, deliver)

    def detach(self, handle_id):
        with self.lock:
            self.attached.pop(handle_id, None)
            self.detached.append(handle_id)

    def push(self, handle_id, rows) -> bool:
        with self.lock:
            entry = self.attached.get(handle_id)
        return entry[2](rows) if entry else False

    def redefine(self, stream) -> bool:  # the rest of `pep.ports.StreamRuntimePort`
        return False

    def drop_stream(self, name: str) -> bool:
        return False

    def health(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {}

    def stop(self):
        pass


@pytest.fixture
def recording_runtime():
    return RecordingRuntime()


def plan(stream: str = "weather", threshold: float = 5.0) -> ExecutionPlan:
    from pep.core.plan import Aggregate, Predicate, WindowSpec

    return ExecutionPlan(
        stream=stream, filter_dnf=((Predicate("rainrate", ">", threshold),),),
        projection=("samplingtime", "rainrate", "windspeed"),
        window=WindowSpec("tuple", 5, 2, (Aggregate("samplingtime", "lastval"),
                                          Aggregate("rainrate", "avg"))))


# -- a whole gateway (real PDP, processor, catalogue, handles; runtime injected) -----------------

TOKENS = {"nea": "tok-nea-0123456789", "lta": "tok-lta-0123456789",
          "other": "tok-other-0123456789"}


def auth_header(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


def write_auth(path) -> None:
    from common.auth import write_auth_file

    write_auth_file(path, [
        {"token": TOKENS["nea"], "subject": "nea", "roles": ["data-owner"], "admin": True},
        {"token": TOKENS["lta"], "subject": "lta", "roles": ["consumer"], "admin": False},
        {"token": TOKENS["other"], "subject": "other", "roles": ["consumer"], "admin": False},
    ])


def build_gateway(data_dir, runtime, heartbeat: float = 0.2, interval: float = 0.25,
                  invalidation=None, store=None):
    """(app, services) over data_dir, with `runtime` in place of Spark's; `store`: the
    gateway's `store` setting (None: SQLite files under data_dir)."""
    from pep.config import GatewayConfig
    from pep.http.app import create_app
    from pep.services import build_services

    data_dir.mkdir(parents=True, exist_ok=True)
    auth = data_dir / "auth.json"
    if not auth.exists():
        write_auth(auth)
    config = GatewayConfig(data_dir=data_dir, auth_file=auth, policies_dir=None, port=0,
                           heartbeat=heartbeat, reevaluation_interval=interval, store=store)
    services = build_services(config, runtime=runtime, invalidation=invalidation)
    return create_app(services=services), services
