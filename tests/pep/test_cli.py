"""The `xsg` command as operators meet it: version, help, settings, logs, start-up checks."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import requests

from common.logs import configure_logging
from pep.cli import main
from pep.config import SERVE_DEFAULTS, GatewayConfig, settings
from pep.http.app import create_app
from pep.services import build_services
from tests.pdp.api.conftest import AUTH_ENTRIES, LTA_REQUEST_XML, TOKENS, XML, bearer

REPO = Path(__file__).resolve().parents[2]
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"xsg {version('xsg')}"


def test_bare_xsg_prints_help_and_succeeds(capsys):
    code, out, _ = run(capsys)
    assert code == 0 and "usage: xsg" in out and "serve" in out and "examples:" in out


def test_serve_help_shows_each_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: None" not in out and "%(default)" not in out
    for setting in settings(SERVE_DEFAULTS):
        assert out.count(f"env {setting.env})") == 1, setting.name
        assert out.count(f"(default: {setting.default_text}; env {setting.env})") == 1, setting.name
    assert out.count("(default: 8080;") == 1
    assert "flags > environment > file > defaults" in out


def test_a_port_in_use_is_reported_at_once_before_spark(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pep.cli", "serve", "--port", str(port), "--data-dir",
             str(tmp_path / "data")], capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    assert f"127.0.0.1:{port} is already in use" in proc.stderr
    assert "Spark" not in proc.stdout and time.monotonic() - started < 30


def test_configuration_errors_are_usage_errors(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "xsg.toml"
    bad.write_text("port = 8080\nthreds = 4\n")
    code, _, err = run(capsys, "serve", "--config", str(bad))
    assert code == 2 and f"{bad}: unknown setting 'threds' (did you mean 'threads'?)" in err
    monkeypatch.setenv("XSG_THREADS", "lots")
    code, _, err = run(capsys, "serve")
    assert code == 2 and "XSG_THREADS: expected an integer, found 'lots'" in err
    monkeypatch.setenv("XSG_THREADS", "٣")  # int() reads it as 3
    code, _, err = run(capsys, "serve")
    assert code == 2 and "XSG_THREADS: expected an integer, found '٣'" in err


@pytest.mark.parametrize("argv", [["policy", "--timeout", "nan", "list"],
                                  ["policy", "--timeout", "٣", "list"],
                                  ["policy", "show", "x", "--store-version", "²"]])
def test_client_flags_are_ascii_finite_numbers(capsys, argv):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and "the value must be a" in capsys.readouterr().err


def closed_port() -> int:
    """A loopback port nobody listens on (bound once, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_cli_says_which_gateway_it_cannot_reach_and_how_to_name_another(capsys,
                                                                           monkeypatch):
    """Issue 42: the client commands used to try :8080 silently; now an unreachable gateway
    is named with where its URL came from (--url, XSG_URL, the default) and how to set it."""
    from pep.cli import common

    port = closed_port()
    default = f"http://127.0.0.1:{port}"
    monkeypatch.setattr(common, "DEFAULT_URL", default)  # not 8080: another gateway may be there
    monkeypatch.setenv("XSG_TOKEN", "t")
    monkeypatch.delenv("XSG_URL", raising=False)
    cases = [((), default, "the default: neither --url nor XSG_URL is set"),
             (("--url", f"http://127.0.0.1:{port}/"), f"http://127.0.0.1:{port}/", "from --url")]
    for flags, url, source in cases:
        for command in (["policy", *flags, "list"], ["stream", *flags, "show", "weather"]):
            code, out, err = run(capsys, *command)
            assert code == 1 and out == ""
            assert f"cannot reach the gateway at {url} ({source}): Connection refused." in err
            assert "--url URL" in err and "export XSG_URL=URL XSG_TOKEN=TOKEN" in err
            assert "xsg serve" in err
    monkeypatch.setenv("XSG_URL", default + "/")
    code, _, err = run(capsys, "policy", "list")
    assert code == 1 and f"at {default}/ (from XSG_URL): Connection refused." in err
    code, _, err = run(capsys, "policy", "--url", f"127.0.0.1:{port}", "list")  # --url wins
    assert code == 2 and f"the gateway URL '127.0.0.1:{port}' (from --url) is not an http://" \
        in err


def test_make_run_takes_the_ports(tmp_path):
    """`make run PORT=... PROXY_PORT=...` (issue 42: they were 8080 and 8081, fixed); read
    from what make would run (-n), so nothing starts."""
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "PROXY_PORT", "MAKEFLAGS")}

    def serve_line(*assignments: str) -> str:
        out = subprocess.run(["make", "-n", "-C", str(REPO), "run", *assignments],
                             capture_output=True, text=True, timeout=60, env=env)
        lines = [line for line in out.stdout.splitlines() if " serve" in line]
        assert out.returncode == 0 and len(lines) == 1, out.stdout + out.stderr
        return " ".join(lines[0].split())

    assert serve_line().endswith("xsg serve --proxy-port 8081")  # XSG_PORT or 8080
    assert serve_line("PORT=9000").endswith("xsg serve --port 9000 --proxy-port 9001")
    assert serve_line("PORT=9000", "PROXY_PORT=9100").endswith(
        "xsg serve --port 9000 --proxy-port 9100")


# -- logs -----------------------------------------------------------------------------------------

@pytest.fixture
def log_stream():
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    yield lambda fmt, level="INFO": configure_logging(level, fmt, stream) and stream
    for handler in list(root.handlers):
        if getattr(handler, "xsg", False):
            root.removeHandler(handler)
            for summary in handler.filters:
                if hasattr(summary, "close"):  # the sums (SafeExceptions holds none)
                    summary.close()
    root.setLevel(level)


def gateway(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(AUTH_ENTRIES))
    services = build_services(GatewayConfig(data_dir=tmp_path / "data", auth_file=auth,
                                            policies_dir=None, port=0))
    return create_app(services=services).test_client(), services


def test_access_log_lines_in_json(tmp_path, log_stream):
    stream = log_stream("json")
    client, services = gateway(tmp_path)
    try:
        client.get("/handles?token=secret-in-query", headers=bearer("lta"))
        client.get("/handles/abcdef0123456789", headers=bearer("lta"))
        client.get("/health")
        client.get("/handles", headers={"Authorization": "Bearer wrong-token-value"})
    finally:
        services.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "xsg.access"]
    assert [(a["method"], a["path"], a["status"]) for a in access] == [
        ("GET", "/handles", 200), ("GET", access[1]["path"], 404), ("GET", "/health", 200),
        ("GET", "/handles", 401)]
    assert access[1]["path"].startswith("/handles/ref:") and "abcdef0123456789" not in \
        access[1]["path"]
    assert access[0]["subject"] == "lta" and access[3]["subject"] is None
    assert all(isinstance(a["duration_ms"], float) and a["time"].endswith("Z") for a in access)
    text = stream.getvalue()
    assert "secret-in-query" not in text and TOKENS["lta"] not in text
    assert "wrong-token-value" not in text


def test_text_lines_have_one_utc_timestamp_format_and_libraries_share_the_handler(log_stream):
    stream = log_stream("text")
    logging.getLogger("xsg.test").warning("hello")
    logging.getLogger("py4j.clientserver").warning("from py4j")
    logging.getLogger("pyspark").warning("from pyspark")
    logging.getLogger("py4j.clientserver").info("a callback")  # py4j: warnings only
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and all(ISO_UTC.match(line) for line in lines), lines
    assert lines[0].endswith("WARNING xsg.test: hello")
    assert "py4j.clientserver: from py4j" in lines[1]
    assert "pyspark: from pyspark" in lines[2]


def test_pyspark_s_query_context_loggers_write_nothing_and_raise_nothing(log_stream):
    """A Spark error with a query context logs its message (which can quote a row's value) on
    PySpark's query-context loggers, with keywords only PySpark's own logger takes: after the
    gateway's logging is set up, that call neither writes a line nor raises (it raised
    TypeError, which replaced the Spark error being raised: seen in CI)."""
    from pyspark.logger import PySparkLogger

    stream = log_stream("text")
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        logger = PySparkLogger.getLogger(name)  # as pyspark.errors.exceptions.base does
        logger.exception("[CAST_INVALID_INPUT] The value 'Mrs Secret' cannot be cast",
                         file="app.py", line="3", fragment="cast", errorClass="CAST")
    assert "Secret" not in stream.getvalue()


def test_a_repeating_warning_is_written_once_then_summed_up(log_stream):
    """Issue 42: the gateway's log writes a warning marked as repeating once, then how often it
    came and the worst value, once per period (`common.log_repeats`); the rest goes on as is."""
    from common.log_repeats import repeating
    from common.logs import flush_repeats

    stream = log_stream("text")
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "xsg", False))
    lateness = logging.getLogger("pep.runtime.lateness")
    for i in range(40):
        lateness.warning("stream weather is falling behind: micro-batch %d took %.1f s", i,
                         0.3 + i / 20, extra=repeating("stream weather is falling behind",
                                                       0.3 + i / 20))
        if i == 20:
            logging.getLogger("xsg.test").warning("something else")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all(ISO_UTC.match(line) for line in lines), lines
    assert lines[0].endswith("WARNING pep.runtime.lateness: stream weather is falling behind: "
                             "micro-batch 0 took 0.3 s")
    assert lines[1].endswith("WARNING xsg.test: something else")
    flush_repeats(handler)  # what `xsg serve` does as it ends (or a minute passing)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and re.search(
        r"WARNING pep.runtime.lateness: stream weather is falling behind: 40 times in the last "
        r"\d+\.\d s, worst 2\.2 s$", lines[2]), lines


# -- xsg serve in a child process, with Spark -----------------------------------------------------

def wait_for(path: Path, pattern: str, proc, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, path.read_text())
        if match:
            return match
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not seen; stdout:\n{path.read_text()}")


def test_xsg_serve_from_a_config_file_with_progress_json_logs_and_token_reload(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(AUTH_ENTRIES))
    config = tmp_path / "xsg.toml"
    config.write_text(f'port = 0\ndata_dir = "data"\nauth_file = "{auth}"\n'
                      f'policies_dir = "{REPO / "policies"}"\nlog_format = "text"\n'
                      '[spark]\n"spark.sql.shuffle.partitions" = 2\n')
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pep.cli", "serve", "--config", str(config)],
            stdout=stdout, stderr=stderr, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO), "XSG_LOG_FORMAT": "json"})
    try:
        url = wait_for(out, r"xsg gateway listening on (\S+)", proc, 240).group(1)
        text = out.read_text()
        assert "starting Spark on local[*]" in text and re.search(
            r"starting Spark on local\[\*\] .*: done in \d+\.\d s", text), text
        r = requests.post(f"{url}/pdp", data=LTA_REQUEST_XML.read_bytes(), timeout=10,
                          headers={**bearer("lta"), "Content-Type": XML})
        assert r.status_code == 200
        # a new token file is used without a restart, a broken one is ignored
        auth.write_text(json.dumps([*AUTH_ENTRIES, {"token": "tok-new-0123456789",
                                                    "subject": "newcomer"}]))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = requests.get(f"{url}/handles", timeout=10,
                             headers={"Authorization": "Bearer tok-new-0123456789"})
            if r.status_code == 200:
                break
            time.sleep(0.3)
        assert r.status_code == 200
        auth.write_text("[not json")
        proc.send_signal(signal.SIGHUP)
        wait_for(err, "previous tokens stay in force", proc, 20)
        assert requests.get(f"{url}/handles", headers=bearer("lta"), timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ours = [json.loads(line) for line in err.read_text().splitlines() if line.startswith("{")]
    access = [line for line in ours if line["logger"] == "xsg.access"]
    assert {"method": "POST", "path": "/pdp", "status": 200, "subject": "lta"}.items() <= \
        access[0].items()
    assert all(line["time"].endswith("Z") for line in ours)
    assert TOKENS["lta"] not in err.read_text() and "tok-new-0123456789" not in err.read_text()


QUIET_STREAM = "quiet_gauge"
QUIET_POLICY = f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="urn:xsg:test:cli:quiet-gauge" Version="1"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
  <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
    <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{QUIET_STREAM}</AttributeValue>
    <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
      AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" MustBePresent="false"
      DataType="http://www.w3.org/2001/XMLSchema#string"/></Match></AllOf></AnyOf></Target>
  <Rule RuleId="read" Effect="Permit"><ObligationExpressions>
    <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">
      <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">
        <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">v</AttributeValue>
      </AttributeAssignmentExpression></ObligationExpression></ObligationExpressions></Rule>
</Policy>""".encode()
QUIET_REQUEST = LTA_REQUEST_XML.read_bytes().replace(b">weather<", f">{QUIET_STREAM}<".encode())


def test_xsg_serve_prints_what_to_paste_and_restarts_and_stops_quietly(tmp_path):
    """Issue 42, as a newcomer meets it: the banner names the console's and the proxy's URLs
    and prints the `export XSG_URL=... XSG_TOKEN=...` lines, which the CLI then uses as they
    are. Under traffic (a reader, an appender every 20 ms), two restarts of the stream's query
    for added attributes and the gateway's stop: no ERROR, no traceback, no Spark WARN line
    ("falling behind" is ours, written once then summed up); the stop is one INFO line, and a
    request arriving while the gateway stops gets a 503, not a 500."""
    proxy_port = closed_port()
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "pep.cli", "serve", "--port", "0", "--proxy-port",
             str(proxy_port), "--data-dir", str(tmp_path / "data"), "--policies",
             str(REPO / "policies"), "--trigger-interval", "0.1"],
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    stop, statuses, reader_events = threading.Event(), [], []
    try:
        wait_for(out, r"\n  try: curl", proc, 240)
        banner = out.read_text()
        url = re.search(r"xsg gateway listening on \S+ \(public URL (\S+)\)", banner).group(1)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and not url.endswith(":0")
        assert f"  console   {url}/console" in banner
        assert f"  proxy     http://127.0.0.1:{proxy_port} (caching proxy" in banner
        exports = dict(re.findall(r"^    export (XSG_URL|XSG_TOKEN)=(\S+)$", banner, re.M))
        tokens = dict(re.findall(r"^    (nea|lta)\s+(\S+)\s+roles:", banner, re.M))
        assert exports == {"XSG_URL": url, "XSG_TOKEN": tokens["nea"]}, banner
        assert requests.get(f"{url}/console", timeout=10).status_code == 200
        deadline = time.monotonic() + 60  # the proxy child starts beside the gateway
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{proxy_port}/health",
                                timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("the proxy of the banner does not answer")
        # the CLI with the pasted lines and nothing else
        cli = subprocess.run([sys.executable, "-m", "pep.cli", "policy", "list"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env={**{k: v for k, v in os.environ.items()
                                     if not k.startswith("XSG_")}, **exports,
                                  "PYTHONPATH": str(REPO)})
        assert cli.returncode == 0 and "urn:xsg:example:weather" in cli.stdout, cli.stderr

        nea = {"Authorization": f"Bearer {tokens['nea']}"}
        lta = {"Authorization": f"Bearer {tokens['lta']}"}
        r = requests.post(f"{url}/streams", headers=nea, timeout=30, json={
            "name": QUIET_STREAM, "source": {"kind": "ingest"},
            "schema": [{"name": "v", "type": "double"}]})
        assert r.status_code == 201, r.text
        r = requests.post(f"{url}/policies", data=QUIET_POLICY, timeout=30,
                          headers={**nea, "Content-Type": XML})
        assert r.status_code == 201, r.text
        r = requests.post(f"{url}/requests", data=QUIET_REQUEST, timeout=60,
                          headers={**lta, "Content-Type": XML})
        assert r.status_code == 201, r.text
        handle = r.json()["handle"]

        def read() -> None:
            try:
                with requests.get(handle, headers={**lta, "Accept": "application/x-ndjson"},
                                  stream=True, timeout=60) as response:
                    for raw in response.iter_lines():
                        if raw:
                            reader_events.append(json.loads(raw))
            except requests.RequestException:
                pass

        def produce() -> None:
            v = 0
            while not stop.is_set():
                try:
                    statuses.append(requests.post(
                        f"{url}/streams/{QUIET_STREAM}/records", data=json.dumps({"v": v}),
                        headers={**nea, "Content-Type": "application/x-ndjson"},
                        timeout=30).status_code)
                except requests.ConnectionError:
                    statuses.append(None)  # the gateway has gone
                v += 1
                time.sleep(0.02)
        threads = [threading.Thread(target=f, daemon=True) for f in (read, produce)]
        for t in threads:
            t.start()

        def rows() -> int:
            return sum(1 for e in reader_events if "row" in e)
        for extra in ("w", "x"):  # each restarts the stream's query on its checkpoint
            seen = rows()
            deadline = time.monotonic() + 60
            while rows() < seen + 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert rows() >= seen + 20, reader_events[-3:]
            r = requests.patch(f"{url}/streams/{QUIET_STREAM}", headers=nea, timeout=60,
                               json={"add_attributes": [{"name": extra, "type": "long"}]})
            assert r.status_code == 200 and r.json()["added"] == [extra], r.text
        seen = rows()
        deadline = time.monotonic() + 60
        while rows() < seen + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rows() >= seen + 20, reader_events[-3:]
        proc.send_signal(signal.SIGTERM)  # with the appender still going
        assert proc.wait(timeout=90) == 0, err.read_text()[-5000:]
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    values = [e["row"]["v"] for e in reader_events if "row" in e]
    assert values == [float(v) for v in range(int(values[0]), int(values[0]) + len(values))]
    # every row read was an acknowledged append (no count in a fixed time: the machine's load
    # sets how many appends fit in the run)
    assert 500 not in statuses and statuses.count(201) >= len(values) >= 60
    lines = err.read_text(errors="replace").splitlines()
    start = next(i for i, line in enumerate(lines) if "xsg listening on" in line)
    ours = [line for line in lines[start:] if " xsg.access: " not in line]
    late = [line for line in ours if " WARNING pep.runtime.lateness: " in line]
    assert all(re.search(rf"stream {QUIET_STREAM} is falling behind: (micro-batch \d+ took "
                         r"|\d+ times? in the last )", line) for line in late), late
    assert len([line for line in late if "micro-batch" in line]) <= 2  # then summed up
    noise = [line for line in ours if line not in late and (
        re.search(r" (WARN|WARNING|ERROR|CRITICAL) ", line)
        or not ISO_UTC.match(line))]  # a traceback's lines, or a line in another format
    assert noise == [], "\n".join(noise[:40])
    gateway = [line for line in ours if ISO_UTC.match(line) and line not in late]
    stopping = next(i for i, line in enumerate(gateway) if "xsg received signal 15" in line)
    # one line, and nothing after it but the proxy child's own stop (the same logger and format)
    assert [line.split(" ", 1)[1] for line in gateway[stopping + 1:]] in (
        [], ["INFO server.serving: xsg-proxy received signal 15, stopping"]), gateway[stopping:]
    assert gateway[stopping].endswith(" INFO server.serving: xsg received signal 15, stopping")


@pytest.mark.parametrize("argv", [
    ["-m", "pep.cli", "pdp", "decide", "--policies", "policies/weather",
     "--request", "policies/weather/lta-request.xml"],
    ["-m", "pep.cli", "pdp", "decide", "--policies", "policies", "--format", "json",
     "--request", "policies/weather/lta-request.json"],
    ["-m", "pdp.conformance", "policies"],
])
def test_a_reader_that_went_away_ends_the_command_quietly(argv):
    """(issue 42) `xsg pdp decide ... | head`: the reader closes the pipe before the output is
    written. No traceback, no "Exception ignored", and the status a shell reports for a Unix
    tool that SIGPIPE ended (141)."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the program writes anything
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == 128 + signal.SIGPIPE, (proc.returncode, err.decode())


def test_each_flags_placeholder_names_the_unit_its_help_gives():
    """(issue 42) `--min-body-rate SECONDS` took bytes per second: a flag's placeholder says
    the unit its help text measures in."""
    from pep.cli import build_parser

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    helps = {s.name: s.help for s in settings(SERVE_DEFAULTS)}
    agrees = {"SECONDS": lambda text: text.startswith("seconds ") or "many seconds" in text,
              "BYTES/S": lambda text: text.startswith("bytes/s "),
              "BYTES": lambda text: "bytes" in text and not text.startswith("bytes/s")}
    seen = set()
    for action in serve._actions:
        if action.dest in helps and action.metavar in agrees:
            text = helps[action.dest]
            assert agrees[action.metavar](text), (action.option_strings, action.metavar, text)
            seen.add(action.dest)
    assert {"min_body_rate", "header_timeout", "max_content_length"} <= seen
    assert next(a.metavar for a in serve._actions if a.dest == "min_body_rate") == "BYTES/S"


def test_xsg_edge_takes_the_log_flags_of_the_other_programs():
    """`xsg edge`, `xsg serve` and `xsg proxy` log alike (common/logs.py): the same flags."""
    from pep.cli import build_parser
    from pep.cli.edge import edge_flags

    args = build_parser().parse_args(["edge", "--log-level", "DEBUG", "--log-format", "json"])
    assert edge_flags(args) == {"delivery": "kafka", "log_level": "DEBUG", "log_format": "json"}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["edge", "--log-format", "xml"])


def test_xsg_edge_says_its_store_pool_size_and_refuses_one_too_small(capsys):
    """The edge's pool size is a flag its help describes (default 4); below 2 its readers'
    checks would hold the one connection its own looks at the store need: a usage error."""
    from pep.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["edge"]).store_pool_size == 4
    assert parser.parse_args(["edge", "--store-pool-size", "12"]).store_pool_size == 12
    with pytest.raises(SystemExit):
        parser.parse_args(["edge", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "--store-pool-size N connections to the store this edge keeps at most" in said
    for bad in ("1", "0", "many", "1001", "\u0663", "1_0"):  # int() took '٣' and '1_0'
        with pytest.raises(SystemExit):
            parser.parse_args(["edge", "--store-pool-size", bad])
        err = capsys.readouterr().err
        assert "--store-pool-size" in err and "expected" in err, err


def test_xsg_edge_serves_as_many_readers_as_the_configuration_allows():
    """`max_connections` of the gateway's configuration holds for its edges too: an edge built
    without it answered 429 to the 4,097th reader whatever the configuration said (bench_edges,
    5,000 handles on one edge); here the limit is 3, so the fourth connection gets 429."""
    from pep.cli.edge import edge_server

    def ok(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    config = GatewayConfig(max_connections=3, header_timeout=4.0)
    server = edge_server(ok, config, "127.0.0.1", 0, "xsg-edge t").start()
    held = []
    try:
        assert server.max_connections == 3 and server.limits.header_timeout == 4.0
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
                for _ in range(3)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        held.append(extra)
        extra.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        said = b""
        while chunk := extra.recv(4096):  # the server closes its side after the answer
            said += chunk
        assert said.startswith(b"HTTP/1.1 429 "), said[:200]
        assert b"at most 3 at once" in said, said
    finally:
        for s in held:
            s.close()
        server.stop()
