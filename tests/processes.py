"""Child processes as users run them (`xsg serve`, `xsg edge`, `python -m proxy`): free ports,
output kept in files (never a pipe nobody reads), start-up awaited by the line a program prints
or by its health route. One place for what the end-to-end tests of several processes share."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (a Kafka broker wants three in a row)."""
    for _ in range(50):
        first = free_port()
        if first + count >= 65000:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return first
    raise RuntimeError("no run of free ports")


class Process:
    """One child process, its output in files (never a pipe nobody reads)."""

    def __init__(self, tmp: Path, name: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(command, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, cwd=tmp, env=env)

    def wait_for(self, prefix: str, timeout: float) -> str:
        """The first line of its stdout that starts with `prefix` (the test fails, with the
        process's output, when none comes in time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in self.out.read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"{self.name} did not come up:\n{self.out.read_text(errors='replace')}"
                    f"\n--- stderr ---\n{self.err.read_text(errors='replace')[-5000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def start_proxy(tmp: Path, upstream: str, env: dict[str, str], *flags: str,
                name: str = "proxy", timeout: float = 60) -> tuple[Process, str]:
    """`python -m proxy --upstream ...` on a free port, answering its health route; without
    a feed token or webhook key (it forwards without caching) unless `env` gives them."""
    port = free_port()
    env = {"XSG_PROXY_TOKEN": "", "XSG_PROXY_SECRET": "", **env}
    proc = Process(tmp, name, [sys.executable, "-u", "-m", "proxy", "--upstream", upstream,
                               "--port", str(port), *flags], env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{url}/proxy/health", timeout=2).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            pass
        if proc.proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{name} did not come up:\n{proc.err.read_text(errors='replace')}")
        time.sleep(0.2)
