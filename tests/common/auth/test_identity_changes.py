"""Identity changes are announced: the token file re-read (on disk, by the watcher, on SIGHUP)
and JWTs with other claims tell the listeners exactly which subjects changed."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from common.auth import (
    TokenAuthenticator,
    TokenFileAuthenticator,
    changed_subjects,
    parse_auth_entries,
)
from common.oidc import CompositeAuthenticator, JwtAuthenticator
from pep.serve import reload_on_sighup
from tests.common.auth.test_oidc import settings


def entry(token: str, subject: str, roles=("consumer",), admin: bool = False,
          **attributes) -> dict:
    return {"token": token, "subject": subject, "roles": list(roles), "admin": admin,
            "attributes": attributes}


def replace_file(path, entries) -> None:
    """Write a new version atomically (a new inode), as a careful editor or a deploy does."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries))
    os.replace(tmp, path)


class Heard:
    """A listener that remembers what it was told, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[frozenset, str]] = []
        self.event = threading.Event()

    def __call__(self, subjects, source) -> None:
        self.calls.append((frozenset(subjects), source))
        self.event.set()


BASE = [entry("tok-a-1", "alice", clearance=2), entry("tok-b-1", "bob"),
        entry("tok-d-1", "dave", ("admin-ish",), admin=True)]


def test_changed_subjects_compares_each_subject_identity():
    old = TokenAuthenticator(parse_auth_entries(BASE))
    new = TokenAuthenticator(parse_auth_entries([
        entry("tok-a-1", "alice", clearance=1),  # attribute lowered
        entry("tok-b-2", "bob"),                 # another token, same identity: unchanged
        entry("tok-c-1", "carol")]))             # added; dave removed
    assert changed_subjects(old, new) == {"alice", "carol", "dave"}
    # a second token of one subject with other roles is a change of that subject
    more = TokenAuthenticator(parse_auth_entries(BASE + [entry("tok-b-9", "bob", ("owner",))]))
    assert changed_subjects(old, more) == {"bob"}
    assert changed_subjects(old, TokenAuthenticator(parse_auth_entries(BASE))) == frozenset()


def test_a_file_change_is_announced_by_the_watcher_without_any_request(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(BASE))
    tokens = TokenFileAuthenticator(path, check_interval=3600)  # requests would not look
    heard = Heard()
    tokens.add_listener(heard)
    tokens.watch(0.05)
    try:
        started = time.monotonic()
        replace_file(path, [entry("tok-a-1", "alice", clearance=1), entry("tok-b-1", "bob")])
        assert heard.event.wait(5)
        assert time.monotonic() - started < 1.0
        assert heard.calls == [(frozenset({"alice", "dave"}), "auth file")]
        # the new tokens are in force when the listener hears of them
        assert tokens.identity_for("dave") is None
        assert tokens.identity_for("alice").attribute("clearance") == (1,)
    finally:
        tokens.stop()
    assert tokens._watcher is None


def test_an_unchanged_rewrite_and_a_broken_file_announce_nothing(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(BASE))
    tokens = TokenFileAuthenticator(path, check_interval=0)
    heard = Heard()
    tokens.add_listener(heard)
    replace_file(path, BASE)  # same identities, new inode: re-read, nobody changed
    tokens.poll()
    assert tokens.reloads == 1 and heard.calls == []
    path.write_text('[{"token": "tok-x"}]')  # broken: the old tokens stay, nothing announced
    tokens.poll()
    assert heard.calls == [] and tokens.identity_for("alice") is not None
    replace_file(path, BASE[:1])  # fixed, with bob and dave removed
    assert tokens.authenticate("tok-a-1").subject == "alice"  # a request looks too
    assert heard.calls == [(frozenset({"bob", "dave"}), "auth file")]


def test_a_listener_that_fails_does_not_undo_the_new_tokens(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(BASE))
    tokens = TokenFileAuthenticator(path, check_interval=0)

    def broken(subjects, source):
        raise RuntimeError("listener bug")

    heard = Heard()
    tokens.add_listener(broken)
    tokens.add_listener(heard)
    replace_file(path, BASE[1:])
    assert tokens.reload() is True
    assert tokens.identity_for("alice") is None and heard.calls == [({"alice"}, "auth file")]


def test_sighup_announces_the_changed_subjects(tmp_path):
    """The path `xsg serve` takes: its SIGHUP handler calls the authenticator's reload."""
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(BASE))
    tokens = TokenFileAuthenticator(path, check_interval=3600)  # only SIGHUP will notice
    composite = CompositeAuthenticator(tokens)
    heard = Heard()
    composite.add_listener(heard)
    replace_file(path, [entry("tok-a-1", "alice", ("consumer", "medic"), clearance=2)] + BASE[1:])
    with reload_on_sighup(SimpleNamespace(authenticator=composite)):
        os.kill(os.getpid(), signal.SIGHUP)
        assert heard.event.wait(5)
    assert heard.calls == [(frozenset({"alice"}), "auth file")]


def test_a_jwt_with_other_claims_is_announced(issuer, tmp_path):
    auth = JwtAuthenticator(settings(issuer), remember_file=tmp_path / "ids.json")
    heard = Heard()
    CompositeAuthenticator(None, auth).add_listener(heard)
    auth.authenticate(issuer.token("alice", clearance=2))
    assert heard.calls == []  # first seen: nothing was granted under another identity
    auth.authenticate(issuer.token("alice", clearance=2))
    assert heard.calls == []  # the same claims again
    auth.authenticate(issuer.token("alice", clearance=1))
    assert heard.calls == [(frozenset({"alice"}), "new token claims")]
    assert auth.identity_for("alice").attribute("clearance") == (1,)
    auth.authenticate(issuer.token("alice", clearance=1, roles=["consumer", "medic"]))
    assert len(heard.calls) == 2
    # remembered across a restart: a changed token after it is still a change
    again = JwtAuthenticator(settings(issuer), remember_file=tmp_path / "ids.json")
    heard2 = Heard()
    again.add_listener(heard2)
    again.authenticate(issuer.token("alice", clearance=3))
    assert heard2.calls == [(frozenset({"alice"}), "new token claims")]


@pytest.mark.parametrize("interval", [0, -1])
def test_no_watcher_without_a_positive_interval(tmp_path, interval):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(BASE))
    tokens = TokenFileAuthenticator(path)
    tokens.watch(interval)
    assert tokens._watcher is None
    tokens.stop()
