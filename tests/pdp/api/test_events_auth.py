"""Policy events and bearer-token authentication (unit level)."""
from __future__ import annotations

import json
import logging

import pytest

from common.auth import AuthFileError, Identity, TokenAuthenticator, parse_auth_entries
from pdp.events import PolicyChange, PolicyEvents


def test_events_in_order_and_unsubscribe():
    events = PolicyEvents()
    seen: list[tuple[str, str]] = []
    unsub_a = events.subscribe(lambda c: seen.append(("a", c.kind)))
    events.subscribe(lambda c: seen.append(("b", c.kind)))
    events.emit(PolicyChange("added", "p", "1.0", "nea"))
    unsub_a()
    unsub_a()  # idempotent
    events.emit(PolicyChange("deleted", "p", "1.0", "nea"))
    assert seen == [("a", "added"), ("b", "added"), ("b", "deleted")]


def test_failing_subscriber_is_logged_and_others_still_run(caplog):
    events = PolicyEvents()
    seen = []

    def broken(change):
        raise ValueError("subscriber bug")

    events.subscribe(broken)
    events.subscribe(seen.append)
    change = PolicyChange("updated", "p", "2.0", "nea", 7)
    with caplog.at_level(logging.ERROR, logger="pdp.events"):
        errors = events.emit(change)
    assert seen == [change]
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    assert "subscriber" in caplog.text and "subscriber bug" in caplog.text


def test_authenticate_tokens():
    auth = TokenAuthenticator([("t-admin", Identity("nea", ("owner",), True)),
                               ("t-user", Identity("lta", ("consumer",), False))])
    assert auth.authenticate("t-admin") == Identity("nea", ("owner",), True)
    assert auth.authenticate_header("Bearer t-user").subject == "lta"
    assert auth.authenticate_header("bearer  t-user").subject == "lta"
    for bad in (None, "", "t-user", "Basic dDp1", "Bearer", "Bearer t-use", "Bearer t-user2"):
        assert auth.authenticate_header(bad) is None, bad


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"),
    ('{"token": "x"}', "expected a JSON list"),
    ("[]", "no entries"),
    ('[42]', "entry 0: expected an object"),
    ('[{"subject": "a"}]', "entry 0: 'token' must be a non-empty string"),
    ('[{"token": "a b", "subject": "a"}]', "must not contain whitespace"),
    ('[{"token": "t", "subject": ""}]', "'subject' must be a non-empty string"),
    ('[{"token": "t", "subject": "a", "roles": "admin"}]', "'roles' must be a list"),
    ('[{"token": "t", "subject": "a", "admin": "yes"}]', "'admin' must be true or false"),
    ('[{"token": "t", "subject": "a", "colour": 1}]', "unknown field(s) colour"),
    ('[{"token": "t", "subject": "a"}, {"token": "t", "subject": "b"}]', "used twice"),
])
def test_malformed_auth_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "auth.json"
    path.write_text(content)
    with pytest.raises(AuthFileError) as err:
        TokenAuthenticator.from_file(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_missing_auth_file(tmp_path):
    with pytest.raises(AuthFileError, match="cannot read auth file"):
        TokenAuthenticator.from_file(tmp_path / "nope.json")


def test_auth_file_roundtrip(tmp_path):
    from common.auth import write_auth_file

    path = tmp_path / "a.json"
    write_auth_file(path, [{"token": "abc", "subject": "s", "roles": ["r"], "admin": False}])
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert parse_auth_entries(json.loads(path.read_text()))[0][1] == Identity("s", ("r",), False)
