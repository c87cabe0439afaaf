"""The memo of parsed requests (`pep.core.parsed`): a request decided from the memo gets exactly
the decision, plan and refusal a fresh parse gets, bound to the identity of that decision."""
import json

import pytest

from common.auth import Identity
from pdp.urns import ACCESS_SUBJECT, RESOURCE, RESOURCE_ID, SUBJECT_ID
from pep.core import access
from pep.core.access import decide_and_plan
from pep.core.errors import Refusal
from pep.core.parsed import ParsedRequests
from pep.core.plan import Predicate

from . import test_access
from .helpers import FIGURE_4A
from .test_access import JSON, MLS, SCHEMAS, WEATHER, XML, request_json

engine = test_access.engine  # test_access's fixture, shared (pytest finds it by this name)


def outcome(engine, body, media_type=XML, who=Identity("lta"), **kw):
    """What a decision gives, comparable: the plan's key, policies and warnings, or the
    refusal's kind, message, details and XACML decision."""
    try:
        grant = decide_and_plan(engine, body, media_type, who, SCHEMAS.get, **kw)
    except Refusal as exc:
        decision = getattr(exc, "decision", None)
        return ("refused", type(exc).__name__, exc.message, dict(exc.details),
                repr(decision) if decision is not None else None)
    return ("granted", access.decision_name(grant.decision), grant.plan.key(),
            sorted(grant.policy_ids), [w.to_json() for w in grant.warnings], grant.sql)


@pytest.fixture
def counted(monkeypatch):
    """Counts the XACML parses `decide_and_plan` makes."""
    calls = []
    real = access.parse_request

    def counting(body, media_type):
        calls.append(body)
        return real(body, media_type)

    monkeypatch.setattr(access, "parse_request", counting)
    return calls


CASES = [
    # permitted: the query beside the request, in its Content, none at all
    ((WEATHER / "lta-request.xml").read_bytes(), XML, Identity("lta"),
     {"user_query": FIGURE_4A, "user_query_type": "xml"}),
    ((WEATHER / "lta-request-with-query.xml").read_bytes(), XML, Identity("lta"), {}),
    ((WEATHER / "lta-request.json").read_bytes(), JSON, Identity("lta"), {}),
    # refused: denied, a query the policy refuses, one that does not parse, two queries
    ((WEATHER / "lta-request.xml").read_bytes(), XML, Identity("mallory"), {}),
    (request_json("weather", {"map": ["temperature"]}), JSON, Identity("lta"), {}),
    (request_json("weather", {"filter": "rainrate >"}), JSON, Identity("lta"), {}),
    ((WEATHER / "lta-request.xml").read_bytes(), XML, Identity("lta"),
     {"user_query": b'{"filter": ', "user_query_type": "json"}),
    ((WEATHER / "lta-request-with-query.xml").read_bytes(), XML, Identity("lta"),
     {"user_query": FIGURE_4A}),
    # refused before the decision: a body that does not parse, an unknown stream
    (b"<Request", XML, Identity("lta"), {}),
    (b'{"Request": ', JSON, Identity("lta"), {}),
    (request_json("snow"), JSON, Identity("lta"), {}),
]


@pytest.mark.parametrize("body,media_type,who,kw", CASES)
def test_the_memo_gives_what_a_fresh_parse_gives(engine, body, media_type, who, kw):
    fresh = outcome(engine, body, media_type, who, **kw)
    memo = ParsedRequests()
    first = outcome(engine, body, media_type, who, parsed=memo, **kw)
    again = outcome(engine, body, media_type, who, parsed=memo, **kw)
    assert first == fresh and again == fresh


def test_a_pass_parses_a_request_once(engine, counted):
    memo = ParsedRequests()
    body = (WEATHER / "lta-request.xml").read_bytes()
    for _ in range(3):
        outcome(engine, body, who=Identity("lta"), parsed=memo, user_query=FIGURE_4A,
                user_query_type="xml")
    assert len(counted) == 1 and memo.hits == 4 and memo.misses == 2
    outcome(engine, body, who=Identity("lta"))  # no memo: parsed as before
    assert len(counted) == 2


def test_what_does_not_parse_is_parsed_and_refused_again_every_time(engine, counted):
    memo = ParsedRequests()
    broken = outcome(engine, b"<Request", parsed=memo)
    assert outcome(engine, b"<Request", parsed=memo) == broken and len(counted) == 2
    assert broken[1] == "MalformedRequest"
    body = (WEATHER / "lta-request.xml").read_bytes()
    first = outcome(engine, body, parsed=memo, user_query=b'{"filter": ', user_query_type="json")
    assert first[1] == "InvalidInput" and first[2].startswith("user query: ")
    assert first == outcome(engine, body, user_query=b'{"filter": ', user_query_type="json")
    assert outcome(engine, body, parsed=memo, user_query=b'{"filter": ',
                   user_query_type="json") == first
    assert len(memo) == 1  # the request that parsed; its query did not, so it is not kept


def test_a_denial_still_comes_before_a_query_that_does_not_parse(engine):
    memo = ParsedRequests()
    body = (WEATHER / "lta-request.xml").read_bytes()
    for _ in range(2):
        denied = outcome(engine, body, XML, Identity("mallory"), parsed=memo,
                         user_query=b'{"filter": ', user_query_type="json")
        assert denied[1] == "AccessDenied"


def test_the_identity_of_each_decision_is_the_one_bound(engine):
    """The memo holds nothing of who asked: the same bytes decided for another identity, or
    for the same subject whose attributes changed, follow that identity."""
    memo = ParsedRequests()
    body = (WEATHER / "lta-request.xml").read_bytes()  # claims to be lta
    assert outcome(engine, body, who=Identity("lta"), parsed=memo)[0] == "granted"
    assert outcome(engine, body, who=Identity("mallory"), parsed=memo)[1] == "AccessDenied"
    owner = decide_and_plan(engine, body, XML, Identity("nea"), SCHEMAS.get, parsed=memo)
    assert owner.plan.filter_dnf is None and owner.subject == "nea"

    request = (MLS / "medic-request.xml").read_bytes()
    levels = []
    for clearance in (1, 2, None):
        attributes = (("clearance", (clearance,)),) if clearance is not None else ()
        medic = Identity("medic-1", roles=("medic", f"clearance:{clearance or 1}"),
                         attributes=attributes)
        try:
            grant = decide_and_plan(engine, request, XML, medic, SCHEMAS.get, parsed=memo)
            levels.append(grant.plan.filter_dnf)
        except Refusal as exc:
            levels.append(type(exc).__name__)
    assert levels == [((Predicate("level", "<=", 1),),), ((Predicate("level", "<=", 2),),),
                      "AccessDenied"]


def test_what_is_kept_is_never_bound_to_a_caller(engine):
    memo = ParsedRequests()
    body = (WEATHER / "lta-request.xml").read_bytes()
    outcome(engine, body, who=Identity("nea"), parsed=memo)
    kept = memo.get_or_parse(("request", body, XML), lambda: pytest.fail("not kept"))
    assert kept.values(ACCESS_SUBJECT, SUBJECT_ID) == ["lta"]  # as the request claims it
    assert kept.values(RESOURCE, RESOURCE_ID) == ["weather"]
    assert not any(a.attribute_id.startswith("urn:xsg:") for i in kept.instances
                   for a in i.attributes)


def test_a_fill_only_view_parses_every_time_and_keeps_what_parsed(engine, counted):
    memo = ParsedRequests()
    body = (WEATHER / "lta-request.json").read_bytes()
    fill = memo.fill_only()
    expected = outcome(engine, body, JSON)
    assert outcome(engine, body, JSON, parsed=fill) == expected
    assert outcome(engine, body, JSON, parsed=fill) == expected
    assert len(counted) == 3 and memo.hits == 0 and len(memo) == 2
    assert outcome(engine, body, JSON, parsed=memo) == expected and len(counted) == 3


def test_bounded_by_entries_and_bytes_least_recently_used_out():
    memo = ParsedRequests(max_entries=3, max_bytes=400, max_entry_bytes=100)
    for n in range(3):
        memo.get_or_parse(("k", b"%d" % n), lambda n=n: n)
    memo.get_or_parse(("k", b"0"), lambda: pytest.fail("kept"))  # 0 used last now
    memo.get_or_parse(("k", b"3"), lambda: 3)
    assert len(memo) == 3
    assert memo.get_or_parse(("k", b"1"), lambda: "again") == "again"  # 1 was dropped
    assert memo.get_or_parse(("k", b"0"), lambda: "again") == 0
    memo.get_or_parse(("huge", b"z" * 101), lambda: "huge")  # over max_entry_bytes: not kept
    assert memo.get_or_parse(("huge", b"z" * 101), lambda: "not kept") == "not kept"
    by_bytes = ParsedRequests(max_entries=100, max_bytes=400, max_entry_bytes=200)
    for n in range(5):  # 5 keys of 100 bytes: the oldest goes when 400 are passed
        by_bytes.get_or_parse(("k", b"%d" % n * 99), lambda n=n: n)
    assert len(by_bytes) == 4 and by_bytes._bytes == 400
    assert by_bytes.get_or_parse(("k", b"0" * 99), lambda: "again") == "again"
    assert by_bytes.get_or_parse(("k", b"4" * 99), lambda: "again") == 4
    with pytest.raises(ValueError):
        ParsedRequests(max_entries=0)


def test_a_parse_that_fails_keeps_nothing():
    memo = ParsedRequests()

    def broken():
        raise ValueError("no")

    for _ in range(2):
        with pytest.raises(ValueError):
            memo.get_or_parse(("k", b"x"), broken)
    assert len(memo) == 0 and memo.misses == 2


def test_a_body_that_is_not_bytes_is_decided_without_the_memo(engine):
    memo = ParsedRequests()
    body = bytearray((WEATHER / "lta-request.json").read_bytes())
    assert outcome(engine, body, JSON, parsed=memo)[0] == "granted" and len(memo) == 0
    assert json.loads(bytes(body))  # untouched
