"""What gateways on one PostgreSQL store share already (the handle read tokens' key), and the seam
a later step announces changes through (every committed write passes one place per store)."""
from __future__ import annotations

import pytest

from pdp.store import PolicyExistsError, SQLPolicyStore
from pep.http.read_tokens import READ_TOKENS_EXTENSION
from tests.pep.conftest import RecordingRuntime, build_gateway


def test_gateways_on_one_postgresql_store_share_the_read_token_key(postgres, tmp_path):
    url = postgres.new_url()
    app_a, a = build_gateway(tmp_path / "a", RecordingRuntime(), store=url)
    app_b, b = build_gateway(tmp_path / "b", RecordingRuntime(), store=url)
    try:
        assert a.read_token_key and a.read_token_key == b.read_token_key
        token, _ = app_a.extensions[READ_TOKENS_EXTENSION].mint("handle-1", "lta")
        assert app_b.extensions[READ_TOKENS_EXTENSION].verify(token, "handle-1") == "lta"
        assert app_b.extensions[READ_TOKENS_EXTENSION].verify(token, "handle-2") is None
    finally:
        a.close()
        b.close()
    app_c, c = build_gateway(tmp_path / "c", RecordingRuntime(), store=url)  # a restart
    try:
        assert c.read_token_key == a.read_token_key
    finally:
        c.close()
    # SQLite: a key per process, as before (nothing stored)
    app_d, d = build_gateway(tmp_path / "d", RecordingRuntime())
    try:
        assert d.read_token_key is None
    finally:
        d.close()


def test_every_committed_write_is_told_once_and_nothing_else(storage):
    store = SQLPolicyStore(storage.database("policies"))
    told: list[str] = []
    store.database.on_commit.append(told.append)
    store.put("a", "1.0", "nea", b"<a/>")
    assert told == ["policies"]
    with pytest.raises(PolicyExistsError):
        store.put("a", "2.0", "nea", b"<a2/>", must_exist=False)  # rolled back: not told
    store.get("a")
    store.list()
    assert told == ["policies"]
    store.put_all([("b", "1.0", "nea", b"<b/>", False), ("c", "1.0", "nea", b"<c/>", False)])
    store.delete("a", "nea")
    assert told == ["policies"] * 3
    store.close()
