"""Suite-wide fixtures. Spark is started at most once per run (a cold session costs seconds),
and only when a test asks for it: the pure-Python tests never start a JVM.

Every test's log records are also checked for secrets (`no_secrets_in_logs`): no line the suite
writes may carry a bearer token, a handle read token or a handle id (README, "Logs"). The
thorough check, with every logger at DEBUG over a representative run, is
tests/pep/http/test_no_secrets_in_logs.py; this one looks at what every other test writes
anyway (WARNING and above unless a test lowers a level), by shape: a bearer credential, a read
token (`v1.<expiry>.`), a handle id (43 URL-safe characters mixing upper and lower case and
digits, as `secrets.token_urlsafe(32)` makes them), and the tokens the test helpers hand out.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "standalone: starts a Spark standalone master and worker (about 30-60 s)")


@pytest.fixture(scope="session")
def spark():
    from pep.runtime.session import create_spark_session
    session = create_spark_session("local[2]", "xsg-tests", {"spark.sql.shuffle.partitions": "2"})
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@contextmanager
def _shared_runtimes() -> Iterator[None]:
    """Every stream runtime made meanwhile serves its ingest streams on the shared query."""
    import dataclasses

    from pep.runtime.runtime import StreamRuntime
    original = StreamRuntime.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.settings = dataclasses.replace(self.settings, shared_query=True)
    StreamRuntime.__init__ = init
    try:
        yield
    finally:
        StreamRuntime.__init__ = original


@pytest.fixture(scope="session", autouse=True)
def shared_query_switch():
    """XSG_TEST_SHARED_QUERY=1: every stream runtime the tests make serves its ingest streams
    on the shared query (pep/runtime/shared/, `RuntimeSettings.shared_query`)."""
    if os.environ.get("XSG_TEST_SHARED_QUERY") != "1":
        yield False
        return
    with _shared_runtimes():
        yield True


def pytest_generate_tests(metafunc):
    if "query_mode" in metafunc.fixturenames:
        modes = ["shared"] if os.environ.get("XSG_TEST_SHARED_QUERY") == "1" else [
            "own", "shared"]
        metafunc.parametrize("query_mode", modes, indirect=True)


@pytest.fixture
def query_mode(request, shared_query_switch):
    """A test that takes this runs in both modes a stream can be served in: "own" (each ingest
    stream its own query, the default) and "shared" (the shared query, issue 49), asserting
    what a user sees in both, so that `make test` keeps the shared query's behaviour the
    per-stream query's (the whole stream suite runs shared with XSG_TEST_SHARED_QUERY=1)."""
    if request.param == "shared" and not shared_query_switch:
        with _shared_runtimes():
            yield "shared"
    else:
        yield request.param


# -- the stores: SQLite files, or one PostgreSQL database ---------------------------------------

@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session (tests/pg_server.py), started on first use; the
    tests that need it skip, saying what to install, only when the machine has no PostgreSQL
    server binaries at all."""
    from tests.pg_server import PostgresUnavailable, start_server

    try:
        server = start_server()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL: {exc}")
    yield server
    server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request):
    """The `store` setting of a test that runs on both stores: None (SQLite files under the
    data dir) or the URL of a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("postgres").new_url()


@pytest.fixture
def storage(store_url, tmp_path):
    """An open `common.db.Storage` on the test's store (SQLite files under tmp_path/data)."""
    from common.db import open_storage

    opened = open_storage(tmp_path / "data", store_url, pool_size=4, timeout=5.0)
    yield opened
    opened.close()


_SECRET_SHAPES = re.compile(
    r"Bearer\s+[\w.~+/-]{8,}"
    r"|(?<![\w.-])v1\.\d{9,}\.[\w-]+\."
    r"|(?<![\w-])(?=[\w-]*[A-Z])(?=[\w-]*[a-z])(?=[\w-]*\d)[\w-]{43}(?![\w-])",
    re.ASCII)
_HELPER_TOKENS = ("tests.pep.conftest", "tests.pep.http.boundaries")


class _SecretWatch(logging.Handler):
    """Remembers the log records that look as if they carried a secret."""

    def __init__(self, known: tuple[str, ...]) -> None:
        super().__init__(logging.NOTSET)
        self.known = known
        self.found: list[str] = []
        self.formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - a record that does not format is not ours to judge
            return
        match = _SECRET_SHAPES.search(text)
        hit = match.group(0) if match else next((t for t in self.known if t in text), None)
        if hit is not None:
            self.found.append(f"{hit[:10]}... in: {text[:300]}")


@pytest.fixture(autouse=True)
def no_secrets_in_logs():
    known = tuple(token for name in _HELPER_TOKENS
                  for token in getattr(sys.modules.get(name), "TOKENS", {}).values())
    watch = _SecretWatch(known)
    root = logging.getLogger()
    level = root.level
    root.setLevel(min(level, logging.INFO) or logging.INFO)  # what `xsg serve` logs by default
    root.addHandler(watch)
    try:
        yield watch
    finally:
        root.removeHandler(watch)
        root.setLevel(level)
        # A test that runs `xsg serve` in process gets its handler on the stderr pytest
        # captured for it and closes afterwards: later records (other tests' threads) would
        # fail to write there ("--- Logging error ---")
        for handler in list(root.handlers):
            if getattr(handler, "xsg", False):
                root.removeHandler(handler)
    assert not watch.found, "a log record carries a secret:\n" + "\n".join(watch.found[:5])
