"""Wiring of the stream side: catalogue, handles, runtime, revocation, and their blueprints.

`register_stream_side(app, services)` is the one call `create_app` makes. It builds the
stream-side services from the gateway's (config, policy service, events, authenticator),
subscribes revocation to the policy events, re-decides and resumes the handles persisted by a
previous run, starts the periodic re-evaluation, registers the blueprints, and keeps everything
in `app.extensions["xsg.streams"]` (a `StreamSide`, whose `close()` stops it all).

The Spark runtime is built lazily on purpose: the SparkSession takes seconds to start, and a
gateway with no stream yet need not pay for it before the first handle. Pass `runtime=` (tests,
embedding) to supply one; otherwise a `StreamRuntime` over `create_spark_session(config.
spark_master)` is created the first time a handle attaches (or at start when there are live
handles to resume), or at registration when `config.start_spark` is true (what `xsg serve`
wants: the session starts with the gateway).

Files under `config.data_dir`: `streams.db` (catalogue), `handles.db` (handles),
`streams/<name>/ingest/` (ingested JSON lines), `runtime/` (the runtime's work directory).
"""
from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pep.handles import (DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, HandleService, HandleStore,
                         new_handle_id)
from pep.handles_api import DEFAULT_HEARTBEAT, create_handles_blueprint
from pep.revocation import RevocationService, policies_mention_time
from pep.streams import StreamCatalog
from pep.streams_api import create_streams_blueprint

log = logging.getLogger(__name__)

STREAMS_EXTENSION = "xsg.streams"


class LazyRuntime:
    """Creates the Spark session and runtime on first use; `stop()` stops what it created."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._runtime: Any = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._runtime is not None

    def get(self) -> Any:
        with self._lock:
            if self._runtime is None:
                self._runtime = self._factory()
            return self._runtime

    def attach(self, handle_id, stream, plan, deliver) -> None:
        self.get().attach(handle_id, stream, plan, deliver)

    def detach(self, handle_id) -> None:
        if self._runtime is not None:
            self._runtime.detach(handle_id)

    def stop(self) -> None:
        with self._lock:
            if self._runtime is not None:
                self._runtime.stop()


def spark_runtime_factory(master: str, work_dir: Path, trigger_interval: float = 0.25
                          ) -> Callable[[], Any]:
    def build() -> Any:
        from pep.runtime.runtime import StreamRuntime
        from pep.runtime.session import create_spark_session

        spark = create_spark_session(master=master)
        return StreamRuntime(spark, work_dir, trigger_interval=trigger_interval)

    return build


@dataclass
class StreamSide:
    catalog: StreamCatalog
    handle_store: HandleStore
    handles: HandleService
    revocation: RevocationService
    runtime: Any
    windows: Any
    resumed: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    _unsubscribe: Callable[[], None] | None = None
    _closed: bool = False

    def close(self, stop_runtime: bool = True) -> None:
        """Stop re-evaluation, close readers (handles stay live for the next start), stop the
        runtime, close the databases. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        self.revocation.stop()
        self.handles.shutdown()
        if stop_runtime and hasattr(self.runtime, "stop"):
            try:
                self.runtime.stop()
            except Exception:  # noqa: BLE001 - closing must go on
                log.exception("stopping the stream runtime failed")
        self.handle_store.close()
        self.catalog.close()


def _identity_lookup(authenticator: Any) -> Callable[[str], Any] | None:
    if authenticator is None or not hasattr(authenticator, "identities"):
        return None

    def lookup(subject: str) -> Any:
        for identity in authenticator.identities:
            if identity.subject == subject:
                return identity
        return None

    return lookup


def seed_streams(catalog: StreamCatalog, path: Path) -> list[str]:
    """Register the example streams of `path` (policies/streams.json) into an empty catalogue.

    Like the policy seeding, it happens once: a catalogue that has ever held a stream is left
    alone, so an owner's deletions and changes survive restarts. Returns the names registered."""
    import json

    if not path.is_file() or catalog.all():
        return []
    names = []
    for entry in json.loads(path.read_text(encoding="utf-8")):
        catalog.register(entry["name"], entry["owner"], entry.get("schema"), entry.get("source"),
                         entry.get("time_attribute"), trusted=True)
        names.append(entry["name"])
    log.info("seeded the stream catalogue with %s from %s", ", ".join(names), path)
    return names


def register_stream_side(app: Any, services: Any, *, runtime: Any = None, windows: Any = None,
                         reevaluation_interval: float = 1.0,
                         heartbeat: float = DEFAULT_HEARTBEAT,
                         buffer_rows: int = DEFAULT_MAX_ROWS,
                         buffer_bytes: int = DEFAULT_MAX_BYTES,
                         trigger_interval: float = 0.25,
                         invalidation: Any = None) -> StreamSide:
    """Build the stream side over `services` (a `pep.app.GatewayServices`) and mount it on `app`.

    `services` needs `.config` (data_dir, spark_master, base_url), `.policies` (`.engine`,
    `.list()`), `.events` (`.subscribe`) and `.authenticator` (`.identities`); optional:
    `.stream_runtime` (a runtime to use instead of Spark's) and `.invalidation` (a
    `pep.invalidation.InvalidationHub`: every revoked/released/ended handle is published to it
    before the revocation returns).
    """
    from pep import processor
    from pep.single_window import WindowRegistry

    config = services.config
    # Knobs may also come from the services/config objects, so that `create_app` needs no
    # arguments for them (tests put a runtime on `services.stream_runtime`).
    if runtime is None:
        runtime = getattr(services, "stream_runtime", None)
    reevaluation_interval = getattr(config, "reevaluation_interval", reevaluation_interval)
    heartbeat = getattr(config, "heartbeat", heartbeat)
    data_dir = Path(config.data_dir)
    catalog = StreamCatalog(data_dir / "streams.db", data_dir)
    if getattr(config, "policies_dir", None) is not None:
        seed_streams(catalog, Path(config.policies_dir) / "streams.json")
    store = HandleStore(data_dir / "handles.db")
    if runtime is None:
        runtime = LazyRuntime(spark_runtime_factory(config.spark_master, data_dir / "runtime",
                                                    trigger_interval))
    windows = windows if windows is not None else WindowRegistry(new_handle_id=new_handle_id)
    handles = HandleService(store, catalog.get, runtime, windows, buffer_rows, buffer_bytes)
    policy_service = services.policies
    # The processor's prepare, told each stream's event-time attribute (time windows need it).
    prepare = functools.partial(processor.prepare, time_attribute_lookup=catalog.time_attribute)
    revocation = RevocationService(
        handles, engine=lambda: policy_service.engine, prepare=prepare,
        schema_lookup=catalog.schema,
        identity_lookup=_identity_lookup(getattr(services, "authenticator", None)),
        time_sensitive=lambda: policies_mention_time(policy_service),
        interval=reevaluation_interval)
    hub = invalidation if invalidation is not None else getattr(services, "invalidation", None)
    if hub is not None:
        handles.add_listener(lambda record: hub.publish(
            f"handle-{record.state.value}", [record.id], subject=record.subject,
            stream=record.stream))
    side = StreamSide(catalog, store, handles, revocation, runtime, windows)
    side._unsubscribe = services.events.subscribe(revocation.on_policy_change)
    if getattr(config, "start_spark", False) and isinstance(runtime, LazyRuntime):
        runtime.get()  # `xsg serve`: pay the session's start-up now, not on the first request
    side.resumed, side.ended = revocation.restore_all()
    revocation.start()

    base_url = config.base_url.rstrip("/") if getattr(config, "base_url", None) else None
    app.register_blueprint(create_streams_blueprint(catalog))
    app.register_blueprint(create_handles_blueprint(
        handles, engine=lambda: policy_service.engine, schema_lookup=catalog.schema,
        prepare=prepare, refused_type=processor.Refused, base_url=base_url,
        heartbeat=heartbeat))
    app.extensions[STREAMS_EXTENSION] = side
    return side


__all__ = ["register_stream_side", "StreamSide", "LazyRuntime", "spark_runtime_factory",
           "STREAMS_EXTENSION"]
