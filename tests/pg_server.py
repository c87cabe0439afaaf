"""A throw-away PostgreSQL server for the tests: Debian's server binaries (`make test` installs
the `postgresql` package when they are missing), a data folder made by `initdb` in a temporary
directory, listening on a free port of 127.0.0.1 and on a Unix socket in that directory, stopped
(and the directory removed) at the end of the session.

PostgreSQL refuses to run as root, and CI runs the tests as root: then the server runs as an
unprivileged user, `postgres` (the Debian package's) when it exists, else `nobody`, else one
this module creates with `useradd`; the temporary directory is given to that user. The server
is made for speed, not for surviving the machine's crash (fsync off): it lives for one test
session.

Each test that wants a store of its own asks for `new_url()`: a fresh schema in the one
database, named by the URL's `options` (how xsg picks its schema: `common.postgres`).
"""
from __future__ import annotations

import atexit
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

DATABASE = "xsg"
SUPERUSER = "xsg"
_schemas = itertools.count(1)


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine (the only reason the tests skip)."""


def server_binaries() -> Path:
    """The directory holding initdb, pg_ctl and postgres of one version (the newest)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    for directory in reversed(candidates):
        if all((directory / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return directory
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl") and shutil.which("postgres"):
        return Path(found).resolve().parent
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres in /usr/lib/postgresql/*/bin "
        "or on PATH): install Debian's postgresql package (`make test` does, as root: "
        "apt-get install postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the server: None (this process's user) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "xsg-postgres"], check=True, capture_output=True, timeout=60)
    return pwd.getpwnam("xsg-postgres")


class PostgresServer:
    """One server: `start()`, `stop()` (and `start()` again: the same data, port and socket),
    `close()` at the end; `new_url()` for a test's own schema."""

    def __init__(self) -> None:
        self.bin = server_binaries()
        self.user = _server_user()
        self.base = Path(tempfile.mkdtemp(prefix="xsg-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = _free_port()
        self.running = False
        if self.user is not None:
            os.chown(self.base, self.user.pw_uid, self.user.pw_gid)
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
                   "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"], timeout=120)
        atexit.register(self.close)

    def _run(self, command: list[str], timeout: float) -> subprocess.CompletedProcess:
        kwargs: dict = {}
        if self.user is not None:  # PostgreSQL will not run as root
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=self.base, env={"PATH": os.environ.get("PATH", ""),
                                                  "HOME": str(self.base), "LC_ALL": "C"},
                              **kwargs)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}\n{log}")
        return done

    def start(self) -> None:
        # fsync off: a commit reaches the OS, not the disk; that outlives the server's crash
        # (`stop("immediate")`), which is all the tests ask (synchronous_commit stays on, or a
        # crash would lose the last commits)
        options = (f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
                   " -c fsync=off -c full_page_writes=off"
                   " -c max_connections=300 -c shared_buffers=16MB")
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                   "-o", options, "-w", "-t", "60", "start"], timeout=90)
        self.running = True
        if not getattr(self, "_created", False):
            import psycopg

            with psycopg.connect(self.url(database="postgres"), autocommit=True) as conn:
                # ordered as a real deployment's database would order text (en-US, not bytes):
                # what xsg needs in byte order, it must ask for (COLLATE "C")
                conn.execute(f"CREATE DATABASE {DATABASE} TEMPLATE template0 ENCODING 'UTF8'"
                             " LOCALE 'C' LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
            self._created = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`immediate`: as a crash would); its data stays for `start()`."""
        if self.running:
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                       "-t", "60", "stop"], timeout=90)
            self.running = False

    def close(self) -> None:
        try:
            self.stop("immediate")
        except Exception:  # noqa: BLE001 - the directory goes anyway
            pass
        shutil.rmtree(self.base, ignore_errors=True)

    def url(self, database: str = DATABASE, schema: str | None = None) -> str:
        """postgresql://xsg@127.0.0.1:<port>/<database>, with `schema` as its search_path."""
        url = f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"
        if schema is not None:
            url += "?options=" + quote(f"-c search_path={schema}", safe="")
        return url

    def new_url(self) -> str:
        """The URL of a schema no test has used yet (xsg creates it on first use)."""
        return self.url(schema=f"t{os.getpid()}_{next(_schemas)}_{int(time.time()) % 100000}")


def start_server() -> PostgresServer:
    """A running server, or PostgresUnavailable when this machine has no binaries."""
    server = PostgresServer()
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


__all__ = ["PostgresServer", "PostgresUnavailable", "server_binaries", "start_server"]
