"""The policy service: the one place where stored policies become the live decision engine.

A change goes through four steps, in this order, so that nothing is ever half-applied:
1. compile the NEW engine from the current one plus the change (an invalid policy fails here,
   before anything is written);
2. commit the change to the store (one transaction);
3. swap the engine (a single attribute assignment; readers take a snapshot and never lock);
4. emit the event, synchronously, so that revocation is complete when the caller returns.
A document is compiled once (`compile_policy`), before the lock, and the engine takes that
compiled form; the new engine is derived from the current one incrementally (see pdp.engine),
so a change costs about the same with 10 or 10,000 stored policies. `add_many` does the same
for a batch: one engine change, one store transaction, then one event per policy.
Writers are serialised by a re-entrant lock that also covers the event, so subscribers see
changes in commit order and a change is fully enforced before the next one starts.

Several processes on one store (`pep.cluster`, `shared`): each follows what the others write,
in store-version order (`catch_up`: the versions after `applied_version`, each applied to the
engine and announced to this process's subscribers as if written here). A local write first
catches up; should another process still commit in between (its version then comes before
ours), the engine is compiled again from the store and the versions in between are announced
with no stream scope (every live handle is decided again: deny when in doubt). Observers in
`on_commit` hear of each local write as soon as it is committed, before this process's
subscribers (a cluster announces it then, so that the other processes revoke while this one
does), and those in `after_write` once the write lock is let go (a cluster waits there for
the other processes to have applied it).
"""
from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pdp.engine import CompiledPolicy, PolicyEngine, PolicyInfo, PolicySource, compile_policy
from pdp.errors import PolicyLoadError
from pdp.events import ChangeKind, PolicyChange, PolicyEvents
from pdp.request import RequestContext
from pdp.results import Response
from pdp.store import PolicyExistsError, PolicyNotFoundError, PolicyStore, StoredPolicy, source_name

log = logging.getLogger(__name__)

# Told of every decision `PolicyService.decide` makes: (the response, seconds it took).
DecisionObserver = Callable[[Response, float], None]


class PolicyIdMismatchError(ValueError):
    """PUT /policies/<id> with a document whose PolicyId is another id."""

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"the document's PolicyId/PolicySetId is {found!r}, "
                         f"but the policy being updated is {expected!r}")
        self.expected = expected
        self.found = found


@dataclass(frozen=True)
class Prospect:
    """A change not applied: the engine it would give and the resources it concerns (None:
    any), in the terms of the PolicyChange it would announce."""

    kind: ChangeKind
    policy_id: str
    engine: PolicyEngine
    resources: frozenset[str] | None


class PolicyService:
    """Owns the compiled engine and keeps it in step with the store."""

    def __init__(self, store: PolicyStore, events: PolicyEvents | None = None,
                 root_combining_alg: str = "deny-overrides",
                 root_policy_id: str | None = None) -> None:
        self.store = store
        self.events = events if events is not None else PolicyEvents()
        self.root_combining_alg = root_combining_alg
        self.root_policy_id = root_policy_id
        self._write_lock = threading.RLock()
        self._decision_observers: list[DecisionObserver] = []
        self._engine: PolicyEngine | None = None
        # The current stored policies by id, as the store holds them: `list()` answers from it
        # instead of reading every row again (event subscribers call it on every change). A new
        # dict per write (copy-on-write), so readers need no lock; `_listed` caches its sorting.
        self._current: dict[str, StoredPolicy] = {}
        self._listed: tuple[dict[str, StoredPolicy], list[StoredPolicy]] | None = None
        # the store version the engine reflects (`catch_up` applies what follows it); `shared`:
        # other processes write the same store (the module docstring)
        self.applied_version = 0
        self.shared = False
        self._remote = threading.local()  # set while another process's writes are announced
        self.on_commit: list[Callable[[list[StoredPolicy]], None]] = []
        self.after_write: list[Callable[[list[StoredPolicy]], None]] = []
        self.reload()

    # -- the engine -----------------------------------------------------------------------------

    def reload(self) -> None:
        """(Re)compile the engine from the store; raises PolicyLoadError if the store is
        unusable."""
        with self._write_lock:
            version = self.store.store_version()
            # shared: the list as of that version, exactly (`catch_up` goes on from there);
            # else the list holds at least that much
            stored = self.store.list_at(version) if self.shared else self.store.list()
            self._engine = PolicyEngine.compile(
                [PolicySource(source_name(p), p.data) for p in stored],
                root_combining_alg=self.root_combining_alg, root_policy_id=self.root_policy_id)
            self._current = {p.policy_id: p for p in stored}
            self.applied_version = version

    def catch_up(self) -> int:
        """Apply, in store order, the versions other processes wrote since `applied_version`
        (each announced to the subscribers as a local write is); returns how many. A version
        the engine already reflects (the list `reload` read may run ahead of its version) is
        passed over."""
        with self._write_lock:
            applied = 0
            self._remote.on = True
            try:
                for stored in self.store.versions_after(self.applied_version):
                    self._apply_remote(stored)
                    self.applied_version = stored.store_version
                    applied += 1
            finally:
                self._remote.on = False
            return applied

    @property
    def following(self) -> bool:
        """Whether the change being announced now (to a subscriber, in this thread) was
        written by another process (a subscriber that records writes, the audit, records it
        once: where it was written)."""
        return bool(getattr(self._remote, "on", False))

    def _apply_remote(self, stored: StoredPolicy) -> None:
        current = self._current.get(stored.policy_id)
        if (current is not None and current.store_version >= stored.store_version) or \
                (stored.deleted and current is None):
            # the engine reflects it already (`reload` read a list that ran ahead of its
            # version), but the subscribers never heard of it: told with no stream scope
            self._emit("deleted" if stored.deleted else "updated", stored, None)
            return
        old = self.engine
        if stored.deleted:
            self._engine = old.with_changes(remove_ids=[stored.policy_id])
            self._remember([stored])
            self._emit("deleted", stored, old.resource_scope(stored.policy_id))
            return
        try:
            doc = compile_policy(PolicySource(source_name(stored), stored.data))
            new_engine = old.with_changes(upsert=[doc], remove_ids=[stored.policy_id]
                                          if stored.policy_id in old.policies else [])
        except PolicyLoadError:
            # written by another process of this gateway, which compiled it: only a
            # configuration that differs between the processes gets here
            log.exception("policy %s (store version %d), written by another process, does "
                          "not compile here; the engine keeps its previous version",
                          stored.policy_id, stored.store_version)
            return
        self._engine = new_engine
        self._remember([stored])
        kind: ChangeKind = "updated" if stored.policy_id in old.policies else "added"
        self._emit(kind, stored, _union(old.resource_scope(stored.policy_id),
                                        new_engine.resource_scope(stored.policy_id))
                   if kind == "updated" else new_engine.resource_scope(stored.policy_id))

    def _swap(self, engine: PolicyEngine, written: list[StoredPolicy],
              announce: Callable[[], None]) -> None:
        """After a local write: the engine it computed becomes the live one and `announce`
        tells the subscribers, unless another process committed a version between our catch-up
        and our write (ours then does not follow `applied_version`): the engine is compiled
        from the store again, and the versions around ours are announced in store order,
        theirs with no stream scope (the module docstring). `written` are consecutive."""
        first, last = written[0].store_version, written[-1].store_version
        self._tell(self.on_commit, written)
        if not self.shared or first == self.applied_version + 1:
            self._engine = engine
            self._remember(written)
            self.applied_version = max(self.applied_version, last)
            announce()
            return
        before = self.applied_version
        self.reload()
        theirs = self.store.versions_after(before, upto=max(self.applied_version, last))
        for stored in theirs:
            if stored.store_version == first:
                announce()
            if first <= stored.store_version <= last:
                continue
            self._remote.on = True
            try:
                self._emit("deleted" if stored.deleted else "updated", stored, None)
            finally:
                self._remote.on = False

    def _written(self, written: list[StoredPolicy]) -> None:
        """Tell `after_write` (outside the write lock)."""
        self._tell(self.after_write, written)

    @staticmethod
    def _tell(observers: list[Callable[[list[StoredPolicy]], None]],
              written: list[StoredPolicy]) -> None:
        for observer in list(observers):
            try:
                observer(written)
            except Exception:  # the write is committed
                log.exception("policy write observer failed")

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> PolicyEngine:
        """A consistent snapshot: keep the returned object for the whole of one decision."""
        engine = self._engine
        if engine is None:
            raise RuntimeError("the policy engine is not loaded")
        return engine

    def decide(self, request: RequestContext) -> Response:
        if not self._decision_observers:
            return self.engine.decide(request)
        started = time.perf_counter()
        response = self.engine.decide(request)
        elapsed = time.perf_counter() - started
        for observer in self._decision_observers:
            observer(response, elapsed)
        return response

    def observe_decisions(self, observer: DecisionObserver) -> None:
        """`observer(response, seconds)` after every `decide` (metrics)."""
        self._decision_observers.append(observer)

    def decide_with_trace(self, request: RequestContext) -> tuple[Response, list[set[str]]]:
        return self.engine.decide_with_trace(request)

    def policy_info(self, policy_id: str) -> PolicyInfo | None:
        return self.engine.policies.get(policy_id)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, policy_id: str, version: str | None = None,
            store_version: int | None = None) -> StoredPolicy:
        return self.store.get(policy_id, version=version, store_version=store_version)

    def list(self) -> list[StoredPolicy]:
        """The current policies ordered by id, as `store.list()` gives them, from memory (the
        store is written through this service only, so the copy is exact)."""
        current = self._current
        listed = self._listed
        if listed is None or listed[0] is not current:
            listed = (current, sorted(current.values(), key=lambda p: p.policy_id))
            self._listed = listed
        return list(listed[1])

    def _remember(self, written: Iterable[StoredPolicy]) -> None:
        current = dict(self._current)
        for stored in written:
            if stored.deleted:
                current.pop(stored.policy_id, None)
            else:
                current[stored.policy_id] = stored
        self._current = current

    def history(self, policy_id: str) -> builtins.list[StoredPolicy]:
        return self.store.history(policy_id)

    # -- writes ---------------------------------------------------------------------------------

    def add(self, data: bytes, owner: str, source: str = "new policy") -> StoredPolicy:
        """Add a policy whose id is not in use; raises PolicyLoadError or PolicyExistsError."""
        doc = compile_policy(PolicySource(source, bytes(data)))
        info = doc.info
        with self._write_lock:
            if self.shared:
                self.catch_up()
            old = self.engine
            if info.id in old.policies:
                raise PolicyExistsError(info.id)
            new_engine = old.with_changes(upsert=[doc])
            stored = self.store.put(info.id, info.version, owner, doc.source.data,
                                    is_policy_set=info.is_policy_set, must_exist=False)
            self._swap(new_engine, [stored], lambda: self._emit(
                "added", stored, new_engine.resource_scope(info.id)))
        self._written([stored])
        return stored

    def add_many(self, documents: Iterable[bytes | PolicySource], owner: str,
                 source: str = "new policy") -> builtins.list[StoredPolicy]:
        """Add several policies, all or none: one engine change, one store transaction.

        A document is bytes (named `<source> #<n>` in errors, n counting from 1) or a
        PolicySource carrying its own name. Raises what `add` raises, naming the offending
        document: PolicyLoadError (its `source`), PolicyExistsError (its `source`, also for an
        id given twice in the batch); then nothing is stored and the engine is unchanged.
        Emits one "added" event per policy, in the order given, after the whole batch is
        committed and live (see PolicyEvents: every subscriber understands one policy per
        event, and a batch kind would be misread by the existing ones).
        """
        docs: list[CompiledPolicy] = []
        for n, item in enumerate(documents, 1):
            src = item if isinstance(item, PolicySource) else \
                PolicySource(f"{source} #{n}", bytes(item))
            docs.append(compile_policy(src))
        if not docs:
            return []
        with self._write_lock:
            if self.shared:
                self.catch_up()
            old = self.engine
            first_of: dict[str, str] = {}
            for doc in docs:
                info = doc.info
                if info.id in old.policies:
                    raise PolicyExistsError(info.id, doc.source.name)
                if info.id in first_of:
                    raise PolicyExistsError(info.id, doc.source.name,
                                            f"also added by {first_of[info.id]}")
                first_of[info.id] = doc.source.name
            new_engine = old.with_changes(upsert=docs)
            written = self.store.put_all([(d.info.id, d.info.version, owner, d.source.data,
                                           d.info.is_policy_set) for d in docs])
            def announce() -> None:
                for stored in written:
                    self._emit("added", stored, new_engine.resource_scope(stored.policy_id))

            self._swap(new_engine, written, announce)
        self._written(written)
        return written

    def update(self, policy_id: str, data: bytes, owner: str,
               source: str | None = None) -> StoredPolicy:
        """Replace a policy with a new version; the document must carry the same id."""
        doc = compile_policy(PolicySource(source or f"new version of {policy_id}", bytes(data)))
        info = doc.info
        if info.id != policy_id:
            raise PolicyIdMismatchError(policy_id, info.id)
        with self._write_lock:
            if self.shared:
                self.catch_up()
            old = self.engine
            if policy_id not in old.policies:
                raise PolicyNotFoundError(policy_id)
            # Remove first: the engine keys documents by (id, version), and the store keeps
            # exactly one current document per id.
            new_engine = old.with_changes(upsert=[doc], remove_ids=[policy_id])
            stored = self.store.put(policy_id, info.version, owner, doc.source.data,
                                    is_policy_set=info.is_policy_set, must_exist=True)
            self._swap(new_engine, [stored], lambda: self._emit(
                "updated", stored, _union(old.resource_scope(policy_id),
                                          new_engine.resource_scope(policy_id))))
        self._written([stored])
        return stored

    def delete(self, policy_id: str, owner: str) -> StoredPolicy:
        """Delete (tombstone) a policy; raises PolicyNotFoundError, or PolicyLoadError when the
        remaining policies would not compile (e.g. a reference to the deleted one)."""
        with self._write_lock:
            if self.shared:
                self.catch_up()
            old = self.engine
            if policy_id not in old.policies:
                raise PolicyNotFoundError(policy_id)
            new_engine = old.with_changes(remove_ids=[policy_id])
            tombstone = self.store.delete(policy_id, owner)
            self._swap(new_engine, [tombstone], lambda: self._emit(
                "deleted", tombstone, old.resource_scope(policy_id)))
        self._written([tombstone])
        return tombstone

    def prospect(self, kind: ChangeKind, policy_id: str, data: bytes | None = None,
                 source: str = "proposed policy") -> Prospect:
        """What a change would make of the engine, without storing, swapping or announcing
        anything: the engine after the change and the resources it concerns, exactly as
        `add` (kind "added"), `update` ("updated") or `delete` ("deleted") would compute them
        now. Raises what they raise (PolicyLoadError, PolicyExistsError, PolicyNotFoundError,
        PolicyIdMismatchError)."""
        old = self.engine
        if kind == "deleted":
            if policy_id not in old.policies:
                raise PolicyNotFoundError(policy_id)
            return Prospect(kind, policy_id, old.with_changes(remove_ids=[policy_id]),
                            old.resource_scope(policy_id))
        doc = compile_policy(PolicySource(source, bytes(data or b"")))
        if doc.info.id != policy_id:
            raise PolicyIdMismatchError(policy_id, doc.info.id)
        if kind == "added":
            if policy_id in old.policies:
                raise PolicyExistsError(policy_id)
            new_engine = old.with_changes(upsert=[doc])
            return Prospect(kind, policy_id, new_engine, new_engine.resource_scope(policy_id))
        if policy_id not in old.policies:
            raise PolicyNotFoundError(policy_id)
        new_engine = old.with_changes(upsert=[doc], remove_ids=[policy_id])
        return Prospect(kind, policy_id, new_engine,
                        _union(old.resource_scope(policy_id), new_engine.resource_scope(policy_id)))

    def _emit(self, kind: ChangeKind, stored: StoredPolicy,
              resources: frozenset[str] | None = None) -> None:
        self.events.emit(PolicyChange(kind=kind, policy_id=stored.policy_id,
                                      version=stored.version, owner=stored.owner,
                                      store_version=stored.store_version, resources=resources))


def _union(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    return None if a is None or b is None else a | b


def policy_files(directory: str | Path) -> list[Path]:
    """XML files under a directory whose root element is Policy or PolicySet (requests and user
    queries living beside them are skipped), in a stable order."""
    from common.xmlsafe import UnsafeDocumentError, parse_xml

    found = []
    for path in sorted(Path(directory).rglob("*.xml")):
        try:
            root = parse_xml(path.read_bytes())
        except UnsafeDocumentError as exc:
            raise PolicyLoadError(str(exc), source=str(path), line=exc.line) from None
        if root.tag.rsplit("}", 1)[-1] in ("Policy", "PolicySet"):
            found.append(path)
    return found


def load_sources(paths: Iterable[str | Path]) -> list[PolicySource]:
    return [PolicySource(str(p), Path(p).read_bytes()) for p in paths]


def seed_store(store: PolicyStore, directory: str | Path, owner: str,
               root_combining_alg: str = "deny-overrides",
               root_policy_id: str | None = None) -> list[StoredPolicy]:
    """Fill an EMPTY store with the policies of a directory, all or nothing.

    The seeds are compiled together first, so an invalid example policy stops the start-up with
    its file and line instead of being half-loaded. A store that already holds anything (even
    only deleted policies) is left alone: the owner's deletions must survive a restart.
    """
    if not store.is_empty():
        return []
    sources = load_sources(policy_files(directory))
    if not sources:
        return []
    docs = [compile_policy(s) for s in sources]
    PolicyEngine.compile(docs, root_combining_alg=root_combining_alg,
                         root_policy_id=root_policy_id)
    try:
        written = store.put_all([(d.info.id, d.info.version, owner, d.source.data,
                                  d.info.is_policy_set) for d in docs])
    except PolicyExistsError:
        if store.is_empty():
            raise
        return []  # another process on the same store seeded it meanwhile
    log.info("seeded the policy store with %d policies from %s", len(written), directory)
    return written


__all__ = ["PolicyService", "Prospect", "PolicyIdMismatchError", "policy_files",
           "load_sources",
           "seed_store"]
