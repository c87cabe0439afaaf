"""One gateway process as a member of a cluster: the pieces of `pep.cluster`, composed and wired
into the process's services (`ClusterNode.wire`), started once its server listens (`start`),
stopped after its stream side (`stop`); its HTTP side (forwarding, `GET /cluster`) is
`pep.http.cluster`'s.

What it connects, in the order a change travels:
- a policy written here is announced once the write lock is let go, and the write answers once
  the other processes acknowledged it (`PolicyService.after_write`); one written elsewhere is
  applied here by version (`PolicyService.catch_up`), which announces it to this process's
  subscribers: revocation re-decides the handles served here, proxies hear of it;
- a stream registered, changed or deleted here is announced the same way; elsewhere the
  catalogue's memory is read again (`StreamCatalog.refresh`), and handles served there on a
  stream that is gone are revoked;
- a stream's requests pass `Placement.claim` (handles, appends, changes, events): served here,
  taken here (its handles resumed: `take_over`), or sent where they are served;
- streams this process can no longer trust are let go (`let_go`): readers get `shutdown`, the
  queries stop with their checkpoints' place kept, the events' states here are forgotten.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from common.db import Storage, StoreUnavailable
from common.errors import described
from pep.cluster.announce import Announcements
from pep.cluster.placement import RENEWALS_PER_LEASE, Placement
from pep.cluster.store import ClusterStore

if TYPE_CHECKING:
    from pdp import StoredPolicy
    from pep.services import GatewayServices
    from pep.streams.entries import StreamEntry

log = logging.getLogger(__name__)

ACK_TIMEOUT = 5.0  # seconds a change waits for the other processes' acknowledgements


def new_member_id() -> str:
    """host-pid-random: which process it is, for the log, and never the same twice."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class ClusterNode:
    """This process in its cluster (the module docstring)."""

    def __init__(self, storage: Storage, lease_seconds: float = 5.0,
                 ack_timeout: float = ACK_TIMEOUT, member: str | None = None) -> None:
        self.member = member or new_member_id()
        self.lease_seconds = lease_seconds
        self.ack_timeout = ack_timeout
        self.store = ClusterStore(storage.database("cluster"), self.member)
        self.placement = Placement(self.store, lease_seconds, self._take_over, self._let_go)
        self.announcements = Announcements(storage.dedicated_connection,
                                           storage.database("cluster"), self.member,
                                           self._apply, self._catch_up, self._others)
        self.url = ""
        self.services: GatewayServices | None = None
        self._streams: set[str] = set()  # the catalogue's names, as last read
        self._started = False
        self._quiet = False
        self._announced = threading.local()  # this thread's policy write, announced

    @property
    def moving_within(self) -> float:
        """The bound on moving a dead process's streams, before their queries start: its lease
        runs out, then one look for orphans (`pep.cluster.placement`)."""
        return self.lease_seconds * (1 + 1 / RENEWALS_PER_LEASE)

    # -- wiring ---------------------------------------------------------------------------------

    def wire(self, services: GatewayServices) -> None:
        """Hook the cluster into the process's services (called by `build_services`)."""
        self.services = services
        services.policies.shared = True
        services.policies.reload()  # as of one store version exactly: followed from there
        services.policies.on_commit.append(self._policy_committed)
        services.policies.after_write.append(self._policy_written)
        services.handles.placement = self.placement
        services.catalog.ingest.before_append = lambda name: self.placement.claim([name])
        if services.lifecycle is not None:
            services.lifecycle.claim = lambda name: self.placement.claim([name])
        services.event_admin.claim = lambda name: self.placement.claim([name])
        if services.derived is not None:
            services.derived.claim = self.placement.claim
        services.catalog.add_listener(lambda definition: self._stream_changed(definition.name))
        services.catalog.add_change_listener(self._stream_entry_changed)
        services.catalog.add_delete_listener(self._stream_deleted)
        self._streams = services.catalog.refresh()

    def describe(self) -> dict[str, Any]:
        members = self.store.members()
        leases = self.store.leases()
        return {
            "member": self.member, "lease_seconds": self.lease_seconds,
            "members": [{"member": m.member, "url": m.url, "host": m.host, "pid": m.pid,
                         "streams": sorted(lease.stream for lease in leases
                                           if lease.member == m.member
                                           and lease.expires_in > 0)} for m in members],
            "leases": [{"stream": lease.stream, "member": lease.member,
                        "epoch": lease.epoch, "expires_in": round(lease.expires_in, 3)}
                       for lease in leases],
        }

    # -- life -----------------------------------------------------------------------------------

    def start(self, url: str) -> None:
        """Join as reachable at `url`; listen, renew, and take the streams no process serves."""
        self.url = url
        if urlsplit(url).hostname in ("0.0.0.0", "::"):
            log.warning("cluster: this process tells the others to reach it at %s, which only "
                        "works on this machine: set advertise_url for processes elsewhere", url)
        self.store.join(url, socket.gethostname(), os.getpid())
        self.announcements.start()
        self.placement.start()
        self._started = True
        log.info("cluster: this process is member %s at %s (leases of %g s)", self.member, url,
                 self.lease_seconds)

    def quiesce(self) -> None:
        """The process is stopping: take no more streams."""
        self._quiet = True

    def stop(self) -> None:
        """After the stream side stopped: stop the threads and give the leases up (the other
        processes take the streams at their next look, from the checkpoints just written)."""
        self._quiet = True
        if not self._started:
            return
        self._started = False
        self.placement.stop()
        self.announcements.stop()
        self.placement.release_all()

    # -- placement's callbacks ----------------------------------------------------------------

    def _take_over(self, streams: list[str]) -> None:
        """This process now serves `streams`: their live handles are decided again and resumed
        here, their events evaluated here."""
        services = self.services
        if services is None or self._quiet:
            return
        records = [r for r in services.handles.live_on_streams(streams)
                   if services.handles.buffer(r.id) is None
                   and self.placement.holds(r.streams)]
        restoring = getattr(services.runtime, "restoring", None)
        if records:
            with restoring() if restoring is not None else nullcontext():
                resumed, ended = services.revocation.restore(
                    records, when="when another gateway process took its stream over")
            services.audit.resumed(services.handle_store.get_many(resumed))
            log.info("cluster: %d handle(s) of %s resumed here, %d ended", len(resumed),
                     ", ".join(streams), len(ended))
            derived = services.derived
            if derived is not None:  # the deriving handles resumed here feed their streams
                here = set(resumed)
                for derivation in services.catalog.derivations.live():
                    if derivation.handle_id in here:
                        derived.feeds.start(derivation.handle_id, derivation.stream)
                derived.settle()
        wanted = set(streams)
        for definition in services.stream_events.all():
            if definition.stream in wanted:
                try:
                    services.stream_events.evaluate(definition, services.runtime)
                except Exception:  # the other events go on
                    log.exception("cannot evaluate event %s", definition.attribute_id)

    def _let_go(self, streams: list[str], reason: str) -> None:
        services = self.services
        if services is None:
            return
        # the handles served here that read these streams: their buffers close first, nothing
        # delivered after (from memory: the store may be what is lost); they stay live, their
        # windows booked
        gone = services.handles.shutdown(streams, reason)
        for name in streams:
            # their queries stop keeping their checkpoints' place (the next process goes on
            # from there), whatever is attached (the streams' events too)
            try:
                services.runtime.drop_stream(name)
            except Exception as exc:  # noqa: BLE001 - the buffers are closed: nothing is delivered
                log.error("cluster: stopping the query of stream %s failed: %s", name,
                          described(exc))
        services.stream_events.forget(streams)
        log.info("cluster: %d handle(s) of %s let go", len(gone), ", ".join(streams))

    # -- announcements ------------------------------------------------------------------------

    def _others(self) -> list[str]:
        return [m.member for m in self.store.members(seen_within=self.lease_seconds)
                if m.member != self.member]

    def _policy_committed(self, written: list[StoredPolicy]) -> None:
        """Announced at once (the others revoke while this process does), waited for once
        this process's own revocation is done (`_policy_written`)."""
        try:
            self._announced.seq = self.announcements.announce(
                "policies", version=written[-1].store_version)
        except StoreUnavailable:
            self._announced.seq = None
            log.warning("cluster: a policy change could not be announced (the store cannot be "
                        "reached); the other processes catch up within %g s",
                        self.announcements.poll)

    def _policy_written(self, written: list[StoredPolicy]) -> None:
        seq = getattr(self._announced, "seq", None)
        self._announced.seq = None
        if seq is not None:
            self.announcements.wait_logged(seq, "policy", self.ack_timeout)

    def _stream_entry_changed(self, entry: StreamEntry, changes: dict[str, Any], by: str) -> None:
        self._stream_changed(entry.definition.name)

    def _stream_changed(self, name: str) -> None:
        self._streams.add(name)
        if self._started:
            self.announcements.announce_and_wait("streams", self.ack_timeout, streams=[name])

    def _stream_deleted(self, name: str) -> None:
        self._streams.discard(name)
        if self._started:
            self.announcements.announce_and_wait("streams", self.ack_timeout, streams=[name])

    def _apply(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "policies":
            self._catch_up_policies()
        elif kind == "streams":
            self._refresh_streams()

    def _catch_up(self) -> None:
        self._catch_up_policies()
        self._refresh_streams()

    def _catch_up_policies(self) -> None:
        services = self.services
        if services is not None:
            services.policies.catch_up()

    def _refresh_streams(self) -> None:
        """Read the catalogue again; a stream gone (deleted through another process) takes the
        handles served here with it (none, but a join's: both streams are served together)."""
        services = self.services
        if services is None:
            return
        now = services.catalog.refresh()
        gone = sorted(self._streams - now)
        self._streams = now
        if not gone:
            return
        served = services.handles.served(services.handles.live_on_streams(gone))
        if served:
            with services.handles.lock:
                services.handles.policy_epoch += 1
                services.handles.revoke_many([(r.id, f"stream(s) {', '.join(gone)} were "
                                              "deleted") for r in served])
        services.stream_events.forget(gone)


__all__ = ["ACK_TIMEOUT", "ClusterNode", "new_member_id"]
