"""The token file is followed while the gateway runs: re-read on change and on SIGHUP; a broken
new version is logged and the tokens in force stay."""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from types import SimpleNamespace

import pytest

from common.auth import AuthFileError, TokenFileAuthenticator
from common.oidc import CompositeAuthenticator
from pep.serve import reload_on_sighup


def write(path, *entries):
    path.write_text(json.dumps([{"token": t, "subject": s, "roles": ["consumer"]}
                                for t, s in entries]))
    # a second write within the file system's timestamp granularity must still be noticed
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_a_changed_file_is_used_without_a_restart(tmp_path):
    path = tmp_path / "auth.json"
    write(path, ("tok-a-123", "alice"))
    auth = TokenFileAuthenticator(path, check_interval=0)
    assert auth.authenticate_header("Bearer tok-a-123").subject == "alice"
    write(path, ("tok-b-456", "bob"), ("tok-c-789", "carol"))
    assert auth.authenticate_header("Bearer tok-a-123") is None
    assert auth.authenticate_header("Bearer tok-b-456").subject == "bob"
    assert auth.identity_for("carol").subject == "carol" and auth.identity_for("alice") is None
    assert auth.reloads == 1


def test_changes_are_looked_for_at_most_every_check_interval(tmp_path):
    path = tmp_path / "auth.json"
    write(path, ("tok-a-123", "alice"))
    now = [0.0]
    auth = TokenFileAuthenticator(path, check_interval=1.0, clock=lambda: now[0])
    write(path, ("tok-b-456", "bob"))
    now[0] = 0.5
    assert auth.authenticate("tok-a-123") is not None  # not looked at yet
    now[0] = 1.5
    assert auth.authenticate("tok-a-123") is None and auth.authenticate("tok-b-456")


def test_a_broken_new_file_is_logged_once_and_the_old_tokens_stay(tmp_path, caplog):
    path = tmp_path / "auth.json"
    write(path, ("tok-a-123", "alice"))
    auth = TokenFileAuthenticator(path, check_interval=0)
    path.write_text('[{"token": "tok-b-456"}]')  # no subject
    with caplog.at_level(logging.ERROR, logger="common.auth"):
        for _ in range(5):
            assert auth.authenticate("tok-a-123").subject == "alice"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "previous tokens stay" in errors[0].getMessage()
    assert "'subject' must be a non-empty string" in errors[0].getMessage()
    path.unlink()  # gone for a moment (an editor's save): still the old tokens
    assert auth.authenticate("tok-a-123").subject == "alice"
    write(path, ("tok-b-456", "bob"))
    assert auth.authenticate("tok-b-456").subject == "bob"
    assert auth.authenticate("tok-a-123") is None


def test_a_broken_file_at_start_is_still_an_error(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text("not json")
    with pytest.raises(AuthFileError, match="not valid JSON"):
        TokenFileAuthenticator(path)


def test_sighup_reloads(tmp_path):
    path = tmp_path / "auth.json"
    write(path, ("tok-a-123", "alice"))
    tokens = TokenFileAuthenticator(path, check_interval=3600)  # only SIGHUP will notice
    services = SimpleNamespace(authenticator=CompositeAuthenticator(tokens))
    write(path, ("tok-b-456", "bob"))
    assert tokens.authenticate("tok-b-456") is None
    before = signal.getsignal(signal.SIGHUP)
    with reload_on_sighup(services):
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5
        while tokens.reloads == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGHUP) is before
    assert tokens.authenticate("tok-b-456").subject == "bob"


def test_a_new_token_never_begins_with_a_dash(monkeypatch):
    """`xsg stream --token <token>` took a token beginning with '-' for an option (one in 64):
    such a draw is drawn again."""
    import secrets

    from common import auth

    draws = iter(["-looks-like-an-option", "-again", "fine_token"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(draws))
    assert auth.new_token() == "fine_token"
    monkeypatch.undo()
    tokens = {auth.new_token() for _ in range(2000)}
    assert len(tokens) == 2000 and not any(t.startswith("-") for t in tokens)
