"""The one place that builds every service of a gateway and wires them together.

Read `build_services` top to bottom to see the whole gateway: what exists, what it is built
from, and who listens to whom, in the order it happens. Everything else receives what it needs
as arguments; nothing else constructs a service or subscribes to an event. (OPA's
`runtime/runtime.go` plays this role there.)

Files under `config.data_dir`: `policies.db` (policy store), `streams.db` (catalogue),
`handles.db` (handles), `events.db` (stream events), `privacy.db` (the consumers' privacy
budgets: what each private window spent), `audit/` (the audit trail, JSON lines), all of which
live in one PostgreSQL database instead when `config.store` names one (`common.db.Storage`; the
audit trail is then a table); `streams/<name>/ingest/` (ingested JSON lines not yet committed
by their stream's query), `runtime/` (the Spark runtime's work directory:
`checkpoints/<stream>/`, kept across restarts, and `archive/<stream>/`, committed ingest files
until retention removes them), `deleted/<stream>-<time>-<id>/` (a deleted stream's files, kept
for the `keep_data` its owner asked for), `auth.json` (demo tokens, when no auth file is given).

"Read `build_services` top to bottom" goes on in `_wire`, once the storage is open.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from common.db import Storage, open_storage
from common.errors import described
from common.oidc import CompositeAuthenticator, build_authenticator
from pdp import (
    ManagePolicy,
    PolicyEvents,
    PolicyService,
    PolicyStore,
    SQLPolicyStore,
    StoredPolicy,
    seed_store,
)
from pep.audit.log import AuditLog, AuditRecords
from pep.audit.table import AuditTable
from pep.audit.trail import AuditTrail, PolicyVersion, PolicyVersions
from pep.config import GatewayConfig, ensure_data_dir, ensure_demo_auth_file
from pep.core.access import AccessPlanner
from pep.core.plan import StreamDefinition
from pep.delivery.control import StreamNotices
from pep.delivery.settings import delivery_settings
from pep.delivery.store import DeliveryStore
from pep.delivery.topics import PlanTopics, delivered_through_topics
from pep.handles.buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS
from pep.handles.one_window import WindowRegistry
from pep.handles.privacy_budget import PrivacyGuard, PrivacyLedger
from pep.handles.records import HandleStore, new_handle_id
from pep.handles.revocation import RevocationService, TimeSensitivity
from pep.handles.service import HandleService, WindowRegistryLike
from pep.handles.stall_notices import StallNotices
from pep.invalidation.hub import InvalidationHub
from pep.metrics import GatewayMetrics, gateway_state
from pep.ports import JoinRuntimePort, StreamRuntimePort
from pep.runtime.lazy import LazyRuntime, spark_runtime_factory
from pep.runtime.sources.kafka_offsets import KafkaOffsets
from pep.streams.catalog import StreamCatalog, seed_streams
from pep.streams.derived import DerivedFeeds, DerivedStreams, admit_streams
from pep.streams.event_admin import StreamEventAdmin
from pep.streams.events import StreamEvents
from pep.streams.lifecycle import StreamLifecycle
from pep.streams.ownership import stream_owner_rule
from pep.streams.visibility import StreamVisibility

if TYPE_CHECKING:
    from pep.cluster.node import ClusterNode

log = logging.getLogger(__name__)


@dataclass
class GatewayServices:
    """Every long-lived part of one gateway process; the HTTP edge only reads these."""

    config: GatewayConfig
    authenticator: CompositeAuthenticator  # the token file (followed), then OIDC JWTs
    store: PolicyStore
    events: PolicyEvents
    policies: PolicyService
    catalog: StreamCatalog
    stream_events: StreamEvents
    runtime: StreamRuntimePort  # the Spark runtime (`LazyRuntime`), or a stand-in
    handle_store: HandleStore
    windows: WindowRegistryLike  # in memory, or in the store with several processes
    handles: HandleService
    revocation: RevocationService
    invalidation: InvalidationHub
    audit: AuditTrail
    metrics: GatewayMetrics
    stall_notices: StallNotices  # tells readers when their stream's query stalls or recovers
    # defines and deletes stream events: stored, evaluated by the runtime, audited
    event_admin: StreamEventAdmin
    # decides and plans one access request (the XACML request, the identity, the user query)
    # with the catalogue's and the stream events' lookups
    access: AccessPlanner
    # who may manage which policy; read on every call, so an embedder may replace it
    may_manage: ManagePolicy
    seeded: list[StoredPolicy] = field(default_factory=list)
    demo_auth_created: bool = False
    resumed: list[str] = field(default_factory=list)  # handles resumed at start
    ended: list[str] = field(default_factory=list)  # handles that could not be resumed
    # runs joins of two streams (pep/runtime/joins/runtime.py)
    join_runtime: JoinRuntimePort | None = None
    # who may see which stream (a restricted one: its owner, admins, whom the PDP may permit)
    visibility: StreamVisibility | None = None
    lifecycle: StreamLifecycle | None = None  # changes and deletions of streams
    # the consumers' privacy budgets for differentially private windows (ledger and guard)
    privacy: PrivacyGuard | None = None
    # where every store above lives (SQLite files, or one PostgreSQL database and its pool)
    storage: Storage | None = None
    # derived streams: consumers with the grant option re-share their handles' rows (issue 48)
    derived: DerivedStreams | None = None
    # the handle read tokens' HMAC key: the configured one, else with a PostgreSQL store the
    # one every process on it shares, else None (a random key per process)
    read_token_key: str | None = None
    # with `config.cluster`: this process as one of several on the store (pep/cluster)
    cluster: ClusterNode | None = None
    # with `delivery = "kafka"`: plan topics, their handles and revocations (pep/delivery)
    delivery: Any = None
    _unsubscribe: list[Callable[[], None]] = field(default_factory=list)
    _stream_side_closed: bool = False

    def close_stream_side(self) -> None:
        """Stop re-evaluation, close readers (final `shutdown` event; handles stay live for the
        next start), stop the runtime, close the stream-side databases. Idempotent.

        Must run before the HTTP server stops: the server waits for its streaming workers, and
        those finish only when their handle buffers close."""
        if self._stream_side_closed:
            return
        self._stream_side_closed = True
        if self.cluster is not None:
            self.cluster.quiesce()  # takes no more streams
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self.authenticator.stop()
        self.revocation.stop()
        self.handles.shutdown()
        # (a stand-in for Spark may be both runtimes: stopped once)
        if self.join_runtime is not None and self.join_runtime is not cast(object, self.runtime):
            try:
                self.join_runtime.stop()
            except Exception as exc:  # noqa: BLE001 - closing must go on
                log.error("stopping the join runtime failed: %s", described(exc))
        try:
            self.runtime.stop()
        except Exception as exc:  # noqa: BLE001 - closing must go on
            log.error("stopping the stream runtime failed: %s", described(exc))
        if self.delivery is not None:
            self.delivery.close()
        if self.cluster is not None:
            # the queries stopped with their checkpoints' place kept: the leases go now, and
            # the other processes take the streams over from there
            self.cluster.stop()
        self.handle_store.close()
        if self.privacy is not None:
            self.privacy.ledger.close()
        self.stream_events.close()
        self.catalog.close()

    def close(self) -> None:
        self.close_stream_side()
        self.invalidation.close()
        self.audit.log.close()
        self.store.close()
        if self.storage is not None:
            self.storage.close()


def build_services(config: GatewayConfig, *, runtime: StreamRuntimePort | None = None,
                   invalidation: InvalidationHub | None = None,
                   buffer_rows: int = DEFAULT_MAX_ROWS,
                   buffer_bytes: int = DEFAULT_MAX_BYTES,
                   progress: Callable[[str], Any] | None = None) -> GatewayServices:
    """Build, wire and start a gateway's services from its configuration.

    `runtime` replaces the Spark runtime (tests, embedding); by default Spark starts lazily with
    the first handle, or now when `config.start_spark` is set (`xsg serve`). `invalidation`
    replaces the hub that caching proxies follow. `progress(what)` (a context manager) is held
    while Spark starts, so that `xsg serve` can say what it is waiting for."""
    # Identity.
    ensure_data_dir(config)
    demo_auth_created = ensure_demo_auth_file(config)
    # The token file, re-read when it changes (and on SIGHUP, see pep/serve.py), then JWTs of
    # the OIDC issuer when one is configured; the last identity verified per JWT subject is kept
    # in oidc-identities.json for re-decisions (common/oidc.py).
    authenticator = build_authenticator(config.effective_auth_file, config.oidc,
                                        remember_file=Path(config.data_dir)
                                        / "oidc-identities.json")

    # Where everything is kept: SQLite files under data_dir, or the PostgreSQL database of
    # `config.store` (connected now: a store that cannot be reached stops the start here).
    data_dir = Path(config.data_dir)
    storage = open_storage(data_dir, config.store, pool_size=config.store_pool_size,
                           timeout=config.store_timeout)
    try:
        return _wire(storage, config, authenticator, demo_auth_created, runtime, invalidation,
                     buffer_rows, buffer_bytes, progress)
    except BaseException:
        storage.close()
        raise


def _wire(storage: Storage, config: GatewayConfig, authenticator: CompositeAuthenticator,
          demo_auth_created: bool, runtime: StreamRuntimePort | None,
          invalidation: InvalidationHub | None, buffer_rows: int, buffer_bytes: int,
          progress: Callable[[str], Any] | None) -> GatewayServices:
    """The rest of `build_services`, on the open storage: every service, built and wired in
    order (a failure closes the storage: `build_services`)."""
    data_dir = Path(config.data_dir)
    # Several processes on the store (pep/cluster): this one's membership, its leases.
    node = None
    if config.cluster:
        from pep.cluster.node import ClusterNode

        node = ClusterNode(storage, config.lease_seconds)
    # Policies: the store (seeded once, when empty), the events, the service over both.
    store = SQLPolicyStore(storage.database("policies", foreign_keys=True))
    try:
        seeded = []
        if config.policies_dir is not None:
            seeded = seed_store(store, config.policies_dir, owner=config.seed_owner,
                                root_combining_alg=config.root_combining_alg,
                                root_policy_id=config.root_policy_id)
        events = PolicyEvents()
        policies = PolicyService(store, events, root_combining_alg=config.root_combining_alg,
                                 root_policy_id=config.root_policy_id)
    except BaseException:
        store.close()
        raise

    # Streams: the catalogue (seeded once, when empty) and the runtime that runs them.
    catalog = StreamCatalog(storage.database("streams"), data_dir)
    delivery_conf = delivery_settings(config)  # None: rows are delivered in this process
    if config.policies_dir is not None:
        seed_streams(catalog, Path(config.policies_dir) / "streams.json")
    if runtime is None:
        def retention_for(name: str) -> float | None:  # a stream's own, asked at every sweep
            entry = catalog.entry(name)
            return entry.retention if entry is not None else None

        runtime = LazyRuntime(spark_runtime_factory(
            config.spark_master, data_dir / "runtime", config.trigger_interval,
            extra_conf=config.spark_session_conf, log_level=config.spark_log_level,
            progress=progress, retention_seconds=config.ingest_retention_seconds,
            retention_bytes=config.ingest_retention_bytes, stall_seconds=config.stall_seconds,
            retention_for=retention_for, delivery=delivery_conf,
            shared=((config.shared_trigger_min, config.shared_trigger_max)
                    if config.shared_query else None)))

    # Stream events: conditions that open grants while they hold (environment attributes).
    stream_events = StreamEvents(storage.database("events"), catalog.get)

    # Access requests: decided and planned the same way when opened and when re-decided.
    # How several applicable rules' obligations combine on a stream: its owner's choice, else
    # the gateway's (pep/core/union.py).
    default_combining = config.obligation_combining
    access = AccessPlanner(time_attribute=catalog.time_attribute,
                           environment=stream_events.environment,
                           combining=lambda stream: (catalog.combining(stream)
                                                     or default_combining))

    # Joins of two streams run as queries of their own, on the same SparkSession.
    join_runtime = join_runtime_for(runtime, data_dir / "runtime" / "joins",
                                    config.trigger_interval, feeds=catalog,
                                    lateness=config.join_lateness)

    # Handles, the one-window rule, the privacy budgets of private windows, and revocation.
    # With several processes, the one-window rule and the budgets are checked in the store's
    # transactions (a stream, its handles and their spends move between processes).
    handle_store = HandleStore(storage.database("handles"))
    windows: Any = WindowRegistry(new_handle_id=new_handle_id)
    if node is not None:
        from pep.cluster.windows import StoreWindows

        windows = StoreWindows(storage.database("cluster"), new_handle_id=new_handle_id)
    privacy = PrivacyGuard(PrivacyLedger(storage.database("privacy"), shared=node is not None))
    # Derived streams (issue 48): every single stream's handle delivers through a tap that
    # appends its rows to the derived stream it feeds, if any, while that stream has a reader;
    # a derived stream whose feed ended takes no new handle, and a handle on one holds its
    # consumer's one window on the streams it derives from too.
    feeds = DerivedFeeds(catalog, has_readers=lambda stream: bool(handles.live_on(stream)))

    def admit(definitions: Sequence[StreamDefinition]) -> None:
        admit_streams(catalog.derivations, definitions)
    # A Kafka stream's handle starts at its partitions' end offsets when requested (the
    # broker's answer, through the gateway's own Kafka client): its cut (issue 41).
    # With delivery = kafka, a single stream's handle is written to its plan's topic and read
    # from the edges instead (pep/delivery/topics.py).
    delivery = None if delivery_conf is None else PlanTopics(
        delivery_conf, DeliveryStore(storage.database("delivery")), handle_store.get,
        delivered_through_topics)
    handles = HandleService(handle_store, catalog.get, runtime, windows, buffer_rows,
                            buffer_bytes, stream_position=catalog.position,
                            join_runtime=join_runtime, privacy=privacy,
                            kafka_cut=KafkaOffsets().end_offsets,
                            tap=feeds.tap if delivery is None else delivery.tap_over(feeds.tap),
                            admit=admit,
                            chain=catalog.derivations.chain)
    revocation = RevocationService(
        handles, engine=lambda: policies.engine, decide_and_plan=access.decide_and_plan,
        schema_lookup=catalog.schema, identity_lookup=_identity_lookup(authenticator),
        time_sensitivity=TimeSensitivity(policies),
        interval=config.reevaluation_interval)

    # Who sees which stream: `listed` ones everybody, `restricted` ones their owner, admins, and
    # the callers the PDP (asked now, with their identity) may permit some action on them.
    visibility = StreamVisibility(
        catalog, engine=lambda: policies.engine, environment=stream_events.environment,
        live_streams=lambda subject: [s for r in handles.list_for(subject) if r.live
                                      for s in r.streams])

    # Caching proxies follow this hub.
    hub = invalidation or InvalidationHub(secret=config.proxy_secret,
                                          proxy_token=config.proxy_token)

    # The audit trail: JSON-lines files beside the SQLite stores, a table of the PostgreSQL one.
    audit_records: AuditRecords = (
        AuditLog(data_dir / "audit", config.audit_max_bytes, config.audit_keep)
        if storage.dialect.name == "sqlite" else AuditTable(storage.database("audit")))
    audit = AuditTrail(audit_records, policy_versions=_policy_versions(policies),
                       policy_scope=lambda policy_id: policies.engine.resource_scope(policy_id),
                       chain=catalog.derivations.chain)

    # Deriving streams: a handle decided again now, as its consumer stands now, must carry the
    # grant option; the policies a derived stream's name already has are checked against it.
    def decide_again(record: Any, identity: Any) -> Any:
        request = record.request
        return access.decide_and_plan(policies.engine, request.body, request.media_type,
                                      identity, catalog.schema, user_query=request.user_query,
                                      user_query_type=request.user_query_type,
                                      parsed=revocation.parsed)

    def policies_about(stream: str) -> list[tuple[str, bytes]]:
        engine = policies.engine
        return [(p.policy_id, p.data) for p in policies.list()
                if (scope := engine.resource_scope(p.policy_id)) is not None and stream in scope]

    derived = DerivedStreams(catalog, handles, feeds, decide=decide_again,
                             policies_about=policies_about, audit=audit,
                             policy_versions=_policy_versions(policies),
                             through_topic=(lambda handle_id: False) if delivery is None else
                             (lambda handle_id: delivery.store.binding(handle_id) is not None))

    # Changing and deleting streams: the catalogue, the events, the runtime, the policies and
    # the live handles, in the order `pep/streams/lifecycle.py` describes.
    def revoke_stream(stream: str, reason: str) -> int:
        with handles.lock:  # the lock `HandleService.open` looks the stream up again under
            handles.policy_epoch += 1
            return len(handles.revoke_many([(r.id, reason)
                                            for r in handles.served(handles.live_on(stream))]))

    def runtime_dirs(stream: str) -> list[tuple[str, Path]]:
        work = data_dir / "runtime"
        return [
            ("checkpoint", work / "checkpoints" / stream),
            ("archive", work / "archive" / stream),
        ]

    lifecycle = StreamLifecycle(
        catalog, events=stream_events, runtime=runtime, policies=policies,
        may_manage=lambda identity, info: services.may_manage(identity, info),
        revoke_stream=revoke_stream, redecide_stream=revocation.on_stream_change,
        live_on=handles.live_on, wait_for_attaches=handles.wait_for_attaches,
        bury_handles=handles.bury_stream, unbury_handles=handles.unbury,
        runtime_dirs=runtime_dirs, deleted_dir=data_dir / "deleted", audit=audit)

    services = GatewayServices(
        config=config, authenticator=authenticator, store=store, events=events,
        policies=policies, catalog=catalog, stream_events=stream_events, runtime=runtime,
        join_runtime=join_runtime, handle_store=handle_store,
        windows=windows, handles=handles, revocation=revocation, invalidation=hub, audit=audit,
        metrics=GatewayMetrics(), stall_notices=StallNotices(runtime.health, handles),
        event_admin=StreamEventAdmin(catalog, stream_events, runtime, audit.event_changed),
        access=access,
        may_manage=stream_owner_rule(catalog.get, may_see=visibility.may_see,
                                     former=catalog.deleted),
        seeded=seeded, demo_auth_created=demo_auth_created, visibility=visibility,
        lifecycle=lifecycle, privacy=privacy, storage=storage, derived=derived,
        read_token_key=config.read_token_key or (
            handle_store.shared_key("read_token_key")
            if storage.dialect.name == "postgresql" else None), cluster=node,
        delivery=delivery)
    if node is not None:
        node.wire(services)

    # Who listens to whom, in the order they are called:
    # 1. a policy change re-decides the live handles first (they are revoked before the PAP
    #    call returns) ...
    services._unsubscribe.append(events.subscribe(revocation.on_policy_change))
    # 2. ... then proxies hear of the change (and flush what it may affect);
    services._unsubscribe.append(hub.follow_policy_events(events))
    # 2b. an identity that changes (the auth file re-read: on disk, by its watcher or at a
    #    request, or SIGHUP; a JWT with other claims) re-decides that subject's live handles at
    #    once, as a policy change does (nothing once the stream side is closed);
    def identity_changed(subjects: frozenset[str], source: str) -> None:
        if not services._stream_side_closed:
            revocation.on_identity_change(subjects, source)

    authenticator.add_listener(identity_changed)
    # 3. handles that end (revoked, released, ended) are published to proxies, after their state
    #    is persisted: one event per kind of ending for a whole batch.
    if delivery is not None:  # the edges stop serving them before anything else is told
        revocation.add_closing_listener(delivery.closing)  # (before a pass's transaction)
        handles.add_listener(delivery.ended)
    handles.add_listener(lambda records: publish_endings(hub, records))
    # 4. a stream event that opens, closes or grows re-decides the live handles on its stream;
    stream_events.add_listener(revocation.on_environment_change)
    revocation.every_tick(stream_events.tick)
    # 5. a stream whose query stalls or fails (and later runs again) is announced to the
    #    readers of its handles (`stalled` / `resumed` notices); /health lists it too.
    revocation.every_tick(services.stall_notices.check)
    if delivery is not None:  # ... and to the edges' readers (the store, the control topic)
        services.stall_notices.add_listener(StreamNotices(
            node.member if node is not None else "gateway", delivery.store.save_stalls,
            delivery.revocations.tell).changed)
    # 5b. deleted streams' files whose keeping time is over are removed (looked at each minute).
    revocation.every_tick(lifecycle.sweep_kept)
    # 6. the audit trail records every grant, ending, policy change and stream registration.
    handles.add_open_listener(audit.granted)
    handles.add_listener(audit.ended)
    # 6b. a deriving handle that ends ends its derived stream: the derived stream's live handles
    #    are revoked at once, transitively (after its own ending is in the audit trail).
    handles.add_listener(derived.handles_ended)
    # (a change another process wrote is its audit entry, not ours: `PolicyService.following`)
    services._unsubscribe.append(events.subscribe(
        lambda change: None if policies.following else audit.policy_changed(change)))
    catalog.add_listener(audit.stream_registered)
    catalog.add_change_listener(audit.stream_changed)

    # Start: Spark now if asked (`xsg serve` pays the session's start-up before the first
    # request), the handles of the previous run re-decided and resumed or ended, and the
    # re-evaluation timer of time-dependent grants.
    if config.start_spark and isinstance(runtime, LazyRuntime):
        runtime.get()
    # Restoring: a stream's query starts once all its restored handles are attached, and a
    # Kafka stream's are first given again what their readers may not have read (issue 41).
    # With several processes, a stream's handles are resumed by the process that takes its
    # lease (pep/cluster/placement.py), once this one's server listens.
    restoring = getattr(runtime, "restoring", None)
    if node is None:
        with restoring() if restoring is not None else nullcontext():
            services.resumed, services.ended = revocation.restore_all()
        audit.resumed(handle_store.get_many(services.resumed))
    derived.settle()  # derivations whose deriving handle did not come back end now
    # 7. metrics: decisions, stream requests and revocations as they happen; the rest is read
    #    from the services at every scrape.
    metrics = services.metrics
    policies.observe_decisions(metrics.decided)
    handles.add_open_listener(lambda record, is_new: metrics.stream_requests.labels(
        outcome="granted").inc())
    revocation.observer = metrics.revoked
    # public metrics name no restricted stream (nobody authenticated may see it), nor one that
    # was deleted (its handles' dropped rows are still counted)
    hidden = ((lambda stream: catalog.visibility(stream) != "listed")
              if config.metrics_public else None)
    metrics.watch(lambda: gateway_state(services, hidden))

    if node is None:  # (a cluster's events are evaluated where their stream is served)
        stream_events.evaluate_all(runtime)  # starts the queries of the streams that have events
    lifecycle.sweep_kept(every=0)
    revocation.start()
    authenticator.watch()  # the auth file is looked at every 0.25 s, requests or not
    return services


def join_runtime_for(runtime: StreamRuntimePort, work_dir: Path, trigger_interval: float = 0.25,
                     feeds: Any = None, lateness: float = 10.0) -> JoinRuntimePort:
    """The runtime of joins beside `runtime`: a `pep.runtime.joins.runtime.JoinRuntime` on the same
    SparkSession, built on first use (so Spark starts no sooner than it would), fed with the
    batches of `ingest` streams by `feeds` (the catalogue). A stand-in for Spark (tests: no
    SparkSession behind it) receives the joins itself: it takes both kinds of plan."""
    if not isinstance(runtime, LazyRuntime) and not hasattr(runtime, "spark"):
        return cast(JoinRuntimePort, runtime)

    def build() -> JoinRuntimePort:  # mypy holds JoinRuntime to the port here
        from pep.runtime.joins.runtime import JoinRuntime

        base = runtime.get() if isinstance(runtime, LazyRuntime) else runtime
        return JoinRuntime(getattr(base, "spark", None), work_dir,
                           trigger_interval=trigger_interval, feeds=feeds, lateness=lateness,
                           mask_keys=getattr(base, "mask_keys", None))

    return LazyRuntime(build)


def _policy_versions(policies: PolicyService) -> PolicyVersions:
    def versions(ids: Iterable[str]) -> list[PolicyVersion]:
        wanted = set(ids)
        return [{"id": p.policy_id, "version": p.version, "store_version": p.store_version}
                for p in policies.list() if p.policy_id in wanted]

    return versions


def publish_endings(hub: InvalidationHub, records: list[Any]) -> None:
    """One invalidation event per kind of ending; subject and stream when all share them."""
    by_kind: dict[str, list[Any]] = {}
    for record in records:
        by_kind.setdefault(f"handle-{record.state.value}", []).append(record)
    for kind, group in by_kind.items():
        subjects = {r.subject for r in group}
        streams = {r.stream for r in group}
        hub.publish(kind, [r.id for r in group],
                    subject=subjects.pop() if len(subjects) == 1 else None,
                    stream=streams.pop() if len(streams) == 1 else None)


def _identity_lookup(authenticator: CompositeAuthenticator) -> Callable[[str], Any]:
    """Find a subject's current identity (roles may have changed since the handle opened):
    the token file's entry, else the last identity verified from the subject's JWT."""
    return authenticator.identity_for


__all__ = ["GatewayServices", "build_services"]
