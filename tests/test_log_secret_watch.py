"""The suite-wide watch over log records (tests/conftest.py, `no_secrets_in_logs`) notices the
shapes of secrets, and leaves ordinary lines alone."""
from __future__ import annotations

import logging
import secrets

import pytest

from pep.core.refs import handle_ref

log = logging.getLogger("xsg.test.watch")


@pytest.mark.parametrize("line", [
    "handle {hid} failed",
    "GET /handles/{hid}?x=1",
    "Authorization: Bearer tok-abcdefgh1234",
    "read with v1.1767225600.nonce.carol.mac",
])
def test_the_watch_notices_a_secret_in_a_log_line(no_secrets_in_logs, line):
    hid = "kD9fX2mQ7vL0pR4sT8wY1zA5bC6eG3hJ-nU_iO2qWxE"  # as secrets.token_urlsafe(32) makes
    assert len(hid) == len(secrets.token_urlsafe(32))
    log.warning(line.format(hid=hid))
    assert len(no_secrets_in_logs.found) == 1, no_secrets_in_logs.found
    no_secrets_in_logs.found.clear()  # noticed: this test's own line is not a leak


def test_the_watch_leaves_ordinary_lines_alone(no_secrets_in_logs):
    hid = secrets.token_urlsafe(32)
    log.warning("handle %s revoked (policy 'urn:xsg:example:weather:nea-policy' updated)",
                handle_ref(hid))
    log.warning("plan %s, stream test_a_join_holds_the_callers_window_on_both_s", "a" * 64)
    log.warning('401: send "Authorization: Bearer <token>" (WWW-Authenticate: Bearer realm="x")')
    assert no_secrets_in_logs.found == []
