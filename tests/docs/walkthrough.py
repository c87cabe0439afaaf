"""Runs a walkthrough of the documentation, as a reader pasting it would, and compares answers.

A walkthrough is a folder of `examples/` holding steps, `NN-<what>.sh` (shell commands: curl,
`xsg`), each with the answer the page says it gives beside it, `NN-<what>.out`, and the files
the steps read (policies, rules, requests, records). The page includes both files with
pymdownx.snippets, so the page and this runner read the same bytes.

The steps run in order in ONE bash process, as lines pasted into one terminal would (a variable
a step sets, `HANDLE=...`, is there for the next), from the repository's root, with the
variables of `examples/env.sh` set for a fresh gateway (`GW`, `XSG_URL`, `XSG_TOKEN`, one per
demo subject: `NEA`, `LTA`, `OTHER`, ...) and the interpreter's folder first on PATH (`xsg`,
`python`), as after `. .venv/bin/activate`.

How an answer is compared with its `.out` file (documented in docs/tests.md):
- line by line, trailing spaces ignored, the step's stdout and stderr together;
- `...` inside a line stands for any text within that line (ids, tokens, times, ports, the
  values of a live generator);
- a line that is only `...` stands for any number of lines, none included.
Nothing else is normalised: what is not elided must come back exactly.
"""
from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
ELLIPSIS = "..."


def steps_of(folder: Path) -> list[Path]:
    """The walkthrough's steps, in the order of their numbers."""
    steps = sorted(folder.glob("[0-9][0-9]-*.sh"))
    if not steps:
        raise AssertionError(f"{folder} has no steps (NN-<what>.sh)")
    return steps


def _line_pattern(expected: str) -> re.Pattern[str]:
    parts = expected.rstrip().split(ELLIPSIS)
    return re.compile(".*".join(re.escape(p) for p in parts), re.DOTALL)


def matches(expected: str, actual: str) -> bool:
    """Whether `actual` is an answer `expected` describes (the rules in the module's doc)."""
    want = [line.rstrip() for line in expected.rstrip("\n").split("\n")] if expected.strip() else []
    got = [line.rstrip() for line in actual.rstrip("\n").split("\n")] if actual.strip() else []

    @functools.cache
    def fit(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i].strip() == ELLIPSIS:
            return fit(i + 1, j) or (j < len(got) and fit(i, j + 1))
        return j < len(got) and bool(_line_pattern(want[i]).fullmatch(got[j])) and fit(i + 1, j + 1)

    return fit(0, 0)


@dataclass
class Gateway:
    """`xsg serve` as a child process on a free port, with a data directory of its own."""
    data_dir: Path
    args: tuple[str, ...] = ()
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    out_path: Path = field(init=False)
    err_path: Path = field(init=False)

    def start(self, timeout: float = 180) -> None:
        self.out_path = self.data_dir.parent / "serve.stdout"
        self.err_path = self.data_dir.parent / "serve.stderr"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "pep.cli", "serve", "--port", "0",
                 "--data-dir", str(self.data_dir), "--heartbeat", "1", *self.args],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in self.out_path.read_text(errors="replace").splitlines():
                if line.startswith("xsg gateway listening on "):
                    self.url = line.split()[4]
            if self.url and any(line.strip().startswith("try:")
                                for line in self.out_path.read_text().splitlines()):
                return
            time.sleep(0.1)
        self.stop()
        raise AssertionError("the gateway did not start:\n" + self.logs())

    def logs(self) -> str:
        return (self.out_path.read_text(errors="replace")[-3000:] + "\n--- stderr ---\n"
                + self.err_path.read_text(errors="replace")[-6000:])

    def environment(self) -> dict[str, str]:
        """What `eval "$(examples/env.sh DATA_DIR URL)"` sets, read through that very script."""
        out = subprocess.run(["sh", str(EXAMPLES / "env.sh"), str(self.data_dir), self.url],
                             cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
        env: dict[str, str] = {}
        for line in out.stdout.splitlines():
            assert line.startswith("export "), line
            for assignment in line[len("export "):].split(" "):
                name, _, value = assignment.partition("=")
                env[name] = value.strip("'")
        return env

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


class Shell:
    """One bash process that the steps are pasted into, one after the other."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.log = open(workdir / "shell.log", "wb")
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=self.log,
            stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
            env={**os.environ, **env, "PATH": path, "PYTHONPATH": str(REPO)})
        self.count = 0

    def run(self, step: Path, timeout: float) -> tuple[int, str]:
        """Sources `step` in the shell; its exit status and everything it printed."""
        self.count += 1
        out = self.workdir / f"step{self.count}.out"
        status = self.workdir / f"step{self.count}.status"
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            f"{{ . '{step}'; }} > '{out}' 2>&1 < /dev/null; echo $? > '{status}.tmp';"
            f" mv '{status}.tmp' '{status}'\n".encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while not status.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                text = out.read_text(errors="replace") if out.exists() else ""
                raise AssertionError(f"{step.name} did not end within {timeout:.0f} s; it printed:"
                                     f"\n{text}")
            time.sleep(0.05)
        return int(status.read_text().strip()), out.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()


def run_walkthrough(name: str, tmp_path: Path, serve_args: tuple[str, ...] = (),
                    step_timeout: float = 90) -> None:
    """Every step of examples/<name>, in order, against a fresh gateway; fails at the first
    step whose exit status is not 0 or whose answer its `.out` file does not describe."""
    folder = EXAMPLES / name
    gateway = Gateway(tmp_path / "data", serve_args)
    gateway.start()
    shell = Shell(tmp_path, gateway.environment())
    try:
        for step in steps_of(folder):
            expected_path = step.with_suffix(".out")
            assert expected_path.exists(), f"{step.name} has no {expected_path.name} beside it"
            code, actual = shell.run(step, step_timeout)
            expected = expected_path.read_text()
            assert code == 0, f"{name}/{step.name} exited {code}; it printed:\n{actual}"
            assert matches(expected, actual), (
                f"{name}/{step.name}: the answer is not what {expected_path.name} says\n"
                f"--- expected ---\n{expected}--- actual ---\n{actual}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- gateway ---\n{gateway.logs()}") from None
    finally:
        shell.close()
        gateway.stop()
