"""PolicyService without HTTP: compile first, commit, swap, emit; readers never see half a
change."""

from __future__ import annotations

import logging
import threading

import pytest

from common.auth import Identity
from pdp import bind_subject
from pdp.errors import PolicyLoadError
from pdp.events import PolicyEvents
from pdp.request import parse_request
from pdp.service import PolicyIdMismatchError, PolicyService, seed_store
from pdp.store import PolicyExistsError, PolicyNotFoundError, SQLitePolicyStore, SQLPolicyStore
from tests.pdp.api.conftest import POLICIES, simple_policy, xml_request

XML = "application/xacml+xml"


@pytest.fixture
def service(storage):
    """The service over a policy store on each database (`storage`: tests/conftest.py)."""
    store = SQLPolicyStore(storage.database("policies"))
    svc = PolicyService(store, PolicyEvents())
    yield svc
    store.close()


def decision(svc, subject, resource):
    return svc.decide(parse_request(xml_request(subject, resource), XML)).results[0].decision.value


def test_lifecycle_and_events(service, caplog):
    seen = []

    def bad_subscriber(change):
        raise RuntimeError("bad subscriber")

    service.events.subscribe(bad_subscriber)
    service.events.subscribe(seen.append)
    with caplog.at_level(logging.ERROR):
        added = service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
        assert decision(service, "u", "r1") == "Permit"
        service.update("urn:t:a", simple_policy("urn:t:a", "r1", "u", "Deny", "1.1"), owner="nea")
        assert decision(service, "u", "r1") == "Deny"
        # only the new version is live, not both
        assert list(service.engine.policies) == ["urn:t:a"]
        service.delete("urn:t:a", owner="admin2")
    assert decision(service, "u", "r1") == "NotApplicable"
    assert added.store_version == 1
    assert [(c.kind, c.version, c.owner, c.store_version) for c in seen] == [
        ("added", "1.0", "nea", 1), ("updated", "1.1", "nea", 2), ("deleted", "1.1", "admin2", 3)]
    failures = [r for r in caplog.records if r.name == "pdp.events" and r.exc_info]
    assert len(failures) == 3  # logged each time, and every write still committed


def test_refused_changes_leave_store_and_engine_alone(service):
    service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
    engine = service.engine
    with pytest.raises(PolicyExistsError):
        service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
    with pytest.raises(PolicyLoadError):
        service.add(b"<Policy", owner="nea")
    with pytest.raises(PolicyIdMismatchError):
        service.update("urn:t:a", simple_policy("urn:t:b"), owner="nea")
    with pytest.raises(PolicyNotFoundError):
        service.update("urn:t:zzz", simple_policy("urn:t:zzz"), owner="nea")
    with pytest.raises(PolicyNotFoundError):
        service.delete("urn:t:zzz", owner="nea")
    assert service.engine is engine and service.store.store_version() == 1


def test_store_failure_keeps_the_old_engine(service, monkeypatch):
    service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
    engine = service.engine

    def broken_put(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(service.store, "put", broken_put)
    with pytest.raises(OSError):
        service.add(simple_policy("urn:t:b", "r2", "u"), owner="nea")
    assert service.engine is engine and "urn:t:b" not in service.engine.policies


def test_readers_see_whole_engines_during_writes(service):
    service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
    stop = threading.Event()
    seen, errors = set(), []

    def reader():
        ctx = parse_request(xml_request("u", "r1"), XML)
        while not stop.is_set():
            try:
                seen.add(service.decide(ctx).results[0].decision.value)
            except Exception as exc:  # noqa: BLE001 - reported below  # pragma: no cover
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(15):
        service.update("urn:t:a", simple_policy("urn:t:a", "r1", "u",
                                                "Deny" if i % 2 else "Permit", f"1.{i + 1}"), "nea")
    service.delete("urn:t:a", "nea")
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert seen <= {"Permit", "Deny", "NotApplicable"} and "Permit" in seen


def test_root_policy_set_and_algorithm(tmp_path):
    store = SQLitePolicyStore(tmp_path / "p.db")
    root = b"""<PolicySet xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicySetId="urn:t:root" Version="1.0"
      PolicyCombiningAlgId="urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:permit-overrides">
      <Target/><PolicyIdReference>urn:t:deny</PolicyIdReference>
      <PolicyIdReference>urn:t:permit</PolicyIdReference></PolicySet>"""
    store.put_all([("urn:t:deny", "1.0", "s", simple_policy("urn:t:deny", "r", "u", "Deny"), False),
                   ("urn:t:permit", "1.0", "s", simple_policy("urn:t:permit", "r", "u"), False),
                   ("urn:t:root", "1.0", "s", root, True)])
    by_root = PolicyService(store, root_policy_id="urn:t:root")
    assert decision(by_root, "u", "r") == "Permit"  # the root set's permit-overrides decides
    assert decision(PolicyService(store), "u", "r") == "Deny"  # default deny-overrides
    assert (
        decision(PolicyService(store, root_combining_alg="permit-overrides"), "u", "r") == "Permit"
    )
    # deleting a policy the root still references is refused, nothing changes
    with pytest.raises(PolicyLoadError):
        by_root.delete("urn:t:permit", "nea")
    assert store.store_version() == 3 and decision(by_root, "u", "r") == "Permit"
    with pytest.raises(PolicyLoadError):
        PolicyService(store, root_policy_id="urn:t:absent")
    store.close()


def test_seed_is_all_or_nothing_and_only_into_an_empty_store(tmp_path):
    store = SQLitePolicyStore(tmp_path / "p.db")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ok.xml").write_bytes(simple_policy("urn:t:ok"))
    (bad / "broken.xml").write_bytes(
        simple_policy("urn:t:broken").replace(b"string-equal", b"nope")
    )
    with pytest.raises(PolicyLoadError) as err:
        seed_store(store, bad, owner="seed")
    assert "broken.xml" in str(err.value)
    assert store.is_empty()
    assert len(seed_store(store, POLICIES, owner="seed")) == 5
    assert seed_store(store, POLICIES, owner="seed") == []
    store.close()


def test_identity_without_roles_binds_an_empty_role_bag(service):
    service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
    ctx = parse_request(xml_request("someone-else", "r1"), XML)
    result = service.decide(bind_subject(ctx, Identity("u"))).results[0]
    assert result.decision.value == "Permit"


# -- compile once, add_many, change scopes, list from memory ------------------------------------


def count_compiles(monkeypatch):
    import pdp.engine

    calls = []
    real = pdp.engine.compile_document
    # documents compiled by an earlier test (the same test on the other store) start afresh
    monkeypatch.setattr(pdp.engine, "_recent", type(pdp.engine._recent)())
    monkeypatch.setattr(pdp.engine, "compile_document",
                        lambda src, **kw: calls.append(src.name) or real(src, **kw))
    return calls


def test_each_document_is_compiled_once(service, monkeypatch):
    from pdp.engine import PolicySource, inspect_policy

    calls = count_compiles(monkeypatch)
    service.add(simple_policy("urn:t:once", "r-once", "u"), owner="nea")
    service.update("urn:t:once", simple_policy("urn:t:once", "r-once", "u", "Deny", "1.1"), "nea")
    assert len(calls) == 2
    # The PAP checks a document before adding it: the add takes that compiled form.
    body = simple_policy("urn:t:checked", "r-checked", "u")
    inspect_policy(PolicySource("request body", body))
    service.add(body, owner="nea", source="request body")
    assert len(calls) == 3
    service.add_many([simple_policy(f"urn:t:m{i}", f"r{i}", "u") for i in range(4)], "nea")
    assert len(calls) == 7


def test_add_many_adds_all_in_one_transaction_and_emits_one_event_each(service):
    seen = []
    service.events.subscribe(seen.append)
    service.add(simple_policy("urn:t:first", "r0", "u"), owner="nea")
    docs = [simple_policy(f"urn:t:b{i}", f"r{i}", "u", "Deny" if i == 2 else "Permit")
            for i in range(1, 5)]
    written = service.add_many(docs, owner="nea")
    assert [w.policy_id for w in written] == [f"urn:t:b{i}" for i in range(1, 5)]
    assert [w.store_version for w in written] == [2, 3, 4, 5]
    assert [(c.kind, c.policy_id, c.store_version, c.resources) for c in seen[1:]] == [
        ("added", f"urn:t:b{i}", i + 1, frozenset({f"r{i}"})) for i in range(1, 5)]
    assert decision(service, "u", "r1") == "Permit" and decision(service, "u", "r2") == "Deny"
    assert [p.policy_id for p in service.list()] == [p.policy_id for p in service.store.list()]
    assert service.add_many([], owner="nea") == [] and len(seen) == 5


@pytest.mark.parametrize("case", ["broken", "exists", "twice", "undefined-ref", "store"])
def test_add_many_is_all_or_nothing(service, monkeypatch, case):
    from pdp.engine import PolicySource

    service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
    engine, listed, seen = service.engine, service.list(), []
    service.events.subscribe(seen.append)
    docs: list = [simple_policy("urn:t:n1", "r2", "u"), simple_policy("urn:t:n2", "r3", "u")]
    if case == "broken":
        docs.append(simple_policy("urn:t:n3").replace(b"string-equal", b"nope"))
        with pytest.raises(PolicyLoadError) as err:
            service.add_many(docs, owner="nea")
        assert err.value.source == "new policy #3"
    elif case == "exists":
        docs.append(PolicySource("file a.xml", simple_policy("urn:t:a", "r9", "u")))
        with pytest.raises(PolicyExistsError) as err:
            service.add_many(docs, owner="nea")
        assert err.value.policy_id == "urn:t:a" and err.value.source == "file a.xml"
    elif case == "twice":
        docs.append(simple_policy("urn:t:n1", "r9", "u"))
        with pytest.raises(PolicyExistsError) as err:
            service.add_many(docs, owner="nea")
        assert err.value.source == "new policy #3" and "new policy #1" in str(err.value)
    elif case == "undefined-ref":
        docs.append(b"""<PolicySet xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
          PolicySetId="urn:t:set" Version="1.0" PolicyCombiningAlgId=
          "urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:deny-overrides"><Target/>
          <PolicyIdReference>urn:t:nowhere</PolicyIdReference></PolicySet>""")
        with pytest.raises(PolicyLoadError, match="undefined reference") as err:
            service.add_many(docs, owner="nea")
        assert err.value.source == "new policy #3"
    else:
        def broken_put_all(items):
            raise OSError("disk full")

        monkeypatch.setattr(service.store, "put_all", broken_put_all)
        with pytest.raises(OSError):
            service.add_many(docs, owner="nea")
    assert service.engine is engine and service.list() == listed and seen == []
    assert service.store.store_version() == 1 and len(service.store.list()) == 1
    assert decision(service, "u", "r2") == "NotApplicable"


def test_add_many_decides_like_adding_one_by_one(tmp_path):
    from pdp.combining import POLICY_COMBINING

    docs = [simple_policy(f"urn:t:{i}", f"r{i % 3}", "u", "Deny" if i % 4 == 1 else "Permit")
            for i in range(12)]
    for n, alg in enumerate(sorted(POLICY_COMBINING)):
        one = SQLitePolicyStore(tmp_path / f"one-{n}.db")
        bulk = SQLitePolicyStore(tmp_path / f"bulk-{n}.db")
        s1, s2 = (
            PolicyService(one, root_combining_alg=alg),
            PolicyService(bulk, root_combining_alg=alg),
        )
        for d in docs:
            s1.add(d, owner="nea")
        s2.add_many(docs, owner="nea")
        for r in ("r0", "r1", "r2", "r3"):
            ctx = parse_request(xml_request("u", r), XML)
            assert s1.decide(ctx) == s2.decide(ctx)
        one.close()
        bulk.close()


def test_change_events_carry_the_resources_they_can_affect(service):
    seen = []
    service.events.subscribe(seen.append)
    service.add(simple_policy("urn:t:a", "r1", "u"), owner="nea")
    service.update("urn:t:a", simple_policy("urn:t:a", "r2", "u", version="1.1"), owner="nea")
    service.delete("urn:t:a", owner="nea")
    unconfined = simple_policy("urn:t:b", "r1", "u").replace(
        b"urn:oasis:names:tc:xacml:1.0:resource:resource-id", b"urn:t:not-the-resource-id")
    service.add(unconfined, owner="nea")
    service.update("urn:t:b", simple_policy("urn:t:b", "r3", "u", version="1.1"), owner="nea")
    assert [(c.kind, c.resources) for c in seen] == [
        ("added", {"r1"}), ("updated", {"r1", "r2"}), ("deleted", {"r2"}),
        ("added", None), ("updated", None)]


def test_list_answers_from_memory_and_matches_the_store(service, monkeypatch):
    service.add(simple_policy("urn:t:b", "r1", "u"), owner="nea")
    service.add_many([simple_policy("urn:t:a", "r2", "u"), simple_policy("urn:t:c", "r3", "u")],
                     owner="nea")
    service.update("urn:t:b", simple_policy("urn:t:b", "r1", "u", "Deny", "1.1"), owner="nea")
    service.delete("urn:t:c", owner="nea")
    assert service.list() == service.store.list()
    assert [p.policy_id for p in service.list()] == ["urn:t:a", "urn:t:b"]

    def no_reads():
        raise AssertionError("the store was read")

    monkeypatch.setattr(service.store, "list", no_reads)
    listed = service.list()
    listed.clear()  # a caller's copy: the service's own is untouched
    assert [p.policy_id for p in service.list()] == ["urn:t:a", "urn:t:b"]
    service.add(simple_policy("urn:t:d", "r4", "u"), owner="nea")
    assert [p.policy_id for p in service.list()] == ["urn:t:a", "urn:t:b", "urn:t:d"]
