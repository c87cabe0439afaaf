"""The policy service: the one place where stored policies become the live decision engine.

A change goes through four steps, in this order, so that nothing is ever half-applied:
1. compile the NEW engine from the current one plus the change (an invalid policy fails here,
   before anything is written);
2. commit the change to the store (one transaction);
3. swap the engine (a single attribute assignment; readers take a snapshot and never lock);
4. emit the event, synchronously, so that revocation is complete when the caller returns.
Writers are serialised by a re-entrant lock that also covers the event, so subscribers see
changes in commit order and a change is fully enforced before the next one starts.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from pdp.engine import PolicyEngine, PolicyInfo, PolicySource, inspect_policy
from pdp.errors import PolicyLoadError
from pdp.events import PolicyChange, PolicyEvents
from pdp.store import PolicyExistsError, PolicyNotFoundError, PolicyStore, StoredPolicy

log = logging.getLogger(__name__)


class PolicyIdMismatchError(ValueError):
    """PUT /policies/<id> with a document whose PolicyId is another id."""

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"the document's PolicyId/PolicySetId is {found!r}, "
                         f"but the policy being updated is {expected!r}")
        self.expected = expected
        self.found = found


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
        self._engine: PolicyEngine | None = None
        self.reload()

    # -- the engine -----------------------------------------------------------------------------

    def reload(self) -> None:
        """(Re)compile the engine from the store; raises PolicyLoadError if the store is unusable."""
        with self._write_lock:
            self._engine = PolicyEngine.compile(
                self.store.current_sources(), root_combining_alg=self.root_combining_alg,
                root_policy_id=self.root_policy_id)

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

    def decide(self, request):
        return self.engine.decide(request)

    def decide_with_trace(self, request):
        return self.engine.decide_with_trace(request)

    def policy_info(self, policy_id: str) -> PolicyInfo | None:
        return self.engine.policies.get(policy_id)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, policy_id: str, version: str | None = None,
            store_version: int | None = None) -> StoredPolicy:
        return self.store.get(policy_id, version=version, store_version=store_version)

    def list(self) -> list[StoredPolicy]:
        return self.store.list()

    def history(self, policy_id: str) -> list[StoredPolicy]:
        return self.store.history(policy_id)

    # -- writes ---------------------------------------------------------------------------------

    def add(self, data: bytes, owner: str, source: str = "new policy") -> StoredPolicy:
        """Add a policy whose id is not in use; raises PolicyLoadError or PolicyExistsError."""
        src = PolicySource(source, bytes(data))
        info = inspect_policy(src)
        with self._write_lock:
            if info.id in self.engine.policies:
                raise PolicyExistsError(info.id)
            new_engine = self.engine.with_changes(upsert=[src])
            stored = self.store.put(info.id, info.version, owner, src.data,
                                    is_policy_set=info.is_policy_set, must_exist=False)
            self._engine = new_engine
            self._emit("added", stored)
        return stored

    def update(self, policy_id: str, data: bytes, owner: str,
               source: str | None = None) -> StoredPolicy:
        """Replace a policy with a new version; the document must carry the same id."""
        src = PolicySource(source or f"new version of {policy_id}", bytes(data))
        info = inspect_policy(src)
        if info.id != policy_id:
            raise PolicyIdMismatchError(policy_id, info.id)
        with self._write_lock:
            if policy_id not in self.engine.policies:
                raise PolicyNotFoundError(policy_id)
            # Remove first: the engine keys documents by (id, version), and the store keeps
            # exactly one current document per id.
            new_engine = self.engine.with_changes(upsert=[src], remove_ids=[policy_id])
            stored = self.store.put(policy_id, info.version, owner, src.data,
                                    is_policy_set=info.is_policy_set, must_exist=True)
            self._engine = new_engine
            self._emit("updated", stored)
        return stored

    def delete(self, policy_id: str, owner: str) -> StoredPolicy:
        """Delete (tombstone) a policy; raises PolicyNotFoundError, or PolicyLoadError when the
        remaining policies would not compile (e.g. a reference to the deleted one)."""
        with self._write_lock:
            if policy_id not in self.engine.policies:
                raise PolicyNotFoundError(policy_id)
            new_engine = self.engine.with_changes(remove_ids=[policy_id])
            tombstone = self.store.delete(policy_id, owner)
            self._engine = new_engine
            self._emit("deleted", tombstone)
        return tombstone

    def _emit(self, kind: str, stored: StoredPolicy) -> None:
        self.events.emit(PolicyChange(kind=kind, policy_id=stored.policy_id,  # type: ignore[arg-type]
                                      version=stored.version, owner=stored.owner,
                                      store_version=stored.store_version))


def policy_files(directory: str | Path) -> list[Path]:
    """XML files under a directory whose root element is Policy or PolicySet (requests and user
    queries living beside them are skipped), in a stable order."""
    from pdp.xmlsafe import UnsafeDocumentError, parse_xml

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
    PolicyEngine.compile(sources, root_combining_alg=root_combining_alg,
                         root_policy_id=root_policy_id)
    infos = [inspect_policy(s) for s in sources]
    written = store.put_all([(i.id, i.version, owner, s.data, i.is_policy_set)
                             for i, s in zip(infos, sources)])
    log.info("seeded the policy store with %d policies from %s", len(written), directory)
    return written


__all__ = ["PolicyService", "PolicyIdMismatchError", "policy_files", "load_sources",
           "seed_store"]
