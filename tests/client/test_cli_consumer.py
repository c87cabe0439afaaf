"""`xsg request | read | handles | release` against the session's gateway (`xsg serve`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from pep.cli import main
from tests.client.conftest import REPO, RawReader, wait_for
from tests.client.test_client import SENSOR, sensor
from tests.pep.conftest import TOKENS
from xsg_client import AccessRequest

XML_REQUEST = """<?xml version="1.0" encoding="UTF-8"?>
<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" ReturnPolicyIdList="false"
         CombinedDecision="false">
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
               IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{stream}</AttributeValue>
    </Attribute>
  </Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:action">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:action:action-id"
               IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">read</AttributeValue>
    </Attribute>
  </Attributes>
</Request>
"""


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_request_read_handles_release(served, capsys, tmp_path):
    served.stream("c_cli", SENSOR, {"id": "urn:t:c_cli", "attributes": ["ts", "n", "tag"]})
    served.stream("c_cli2", SENSOR, {"attributes": ["n"]})
    request = tmp_path / "request.json"
    request.write_bytes(AccessRequest.for_stream("c_cli", "subscribe").body)
    common = ["--url", served.url, "--token", TOKENS["lta"]]

    code, out, _ = run_cli(capsys, "request", str(request), "--query", '{"filter": "n > 0"}',
                           *common)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"{served.url}/handles/")
    handle = lines[0]
    assert lines[1] == "  new handle on c_cli; policies: urn:t:c_cli"
    assert any(line.startswith("  warning (PR): partial result: the policy hides attribute(s) v")
               for line in lines)
    assert "  plan:" in lines and "    WHERE `n` >= 1;" in lines  # n > 0, over longs
    code, out, _ = run_cli(capsys, "request", str(request), "--query", '{"filter": "n > 0"}',
                           "--json", *common)
    assert code == 0 and json.loads(out)["new"] is False and json.loads(out)["handle"] == handle

    served.append("c_cli", sensor([0, 1, 2, 2 ** 63 - 1]))  # n > 0: three rows
    reader = RawReader(handle).start()
    wait_for(lambda: len(reader.rows()) == 3, what="3 rows")
    code, out, err = run_cli(capsys, "read", handle, "--format", "csv", "--idle", "0.5", *common)
    assert code == 0, err
    assert out.splitlines() == ["ts,n,tag", "2024-01-01T00:00:00.000000Z,1,x",
                                "2024-01-01T00:00:00.000000Z,2,x",
                                f"2024-01-01T00:00:00.000000Z,{2 ** 63 - 1},x"]
    assert "xsg read: 3 rows in" in err and "resume with --from 3" in err
    code, out, err = run_cli(capsys, "read", handle, "--from", "2", "--idle", "0.5", *common)
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == [
        {"id": 3, "row": {"ts": "2024-01-01T00:00:00.000000Z", "n": 2 ** 63 - 1, "tag": "x"}}]
    code, out, _ = run_cli(capsys, "read", handle.rsplit("/", 1)[1], "--format", "table",
                           "--idle", "0.5", *common)  # by id, on --url
    assert out.splitlines()[0].split() == ["ts", "n", "tag"]
    assert out.splitlines()[3].split() == ["2024-01-01T00:00:00.000000Z", str(2 ** 63 - 1), "x"]

    # --follow until the end: revoked -> status 1, with the reason; progress on stderr
    out_file, err_file = tmp_path / "follow.out", tmp_path / "follow.err"
    with open(out_file, "wb") as stdout, open(err_file, "wb") as stderr:
        follow = subprocess.Popen(
            [sys.executable, "-m", "pep.cli", "read", handle, "--follow", *common],
            stdout=stdout, stderr=stderr, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        served.append("c_cli", sensor([5]))
        wait_for(lambda: len(out_file.read_text().splitlines()) == 4, what="4 rows followed")
        served.call("DELETE", "/policies/urn:t:c_cli", ok=(204,))
        follow.wait(60)
    finally:
        follow.kill()
    out, err = out_file.read_text(), err_file.read_text()
    assert follow.returncode == 1, err
    assert len(out.splitlines()) == 4 and json.loads(out.splitlines()[-1])["row"]["n"] == 5
    assert "xsg read: the handle was revoked: " in err  # when it came, and in the summary
    assert err.count("the handle was revoked: ") == 2 and "rows/s); the handle was" in err
    assert "4 rows in" in err

    code, out, _ = run_cli(capsys, "handles", *common)
    table = out.splitlines()
    assert table[0].split()[:3] == ["HANDLE", "STATE", "STREAM"]
    assert any(line.startswith(handle) and line.split()[1:3] == ["revoked", "c_cli"]
               for line in table)
    code, out, _ = run_cli(capsys, "request", str(request).replace("request.json", "r2.json"),
                           *common)
    assert code == 2  # no such file
    second = tmp_path / "r2.xml"  # a XACML request in XML, its query in XML too
    second.write_text(XML_REQUEST.format(stream="c_cli2"))
    query = "<UserQuery><Filter><FilterCondition>n &gt; 1</FilterCondition></Filter></UserQuery>"
    code, out, _ = run_cli(capsys, "request", str(second), "--query", query, *common)
    assert code == 0 and "    WHERE `n` >= 2;" in out.splitlines()
    other = out.splitlines()[0]
    code, out, _ = run_cli(capsys, "release", other, *common)
    assert code == 0 and out.startswith("released /handles/") and "(state released)" in out
    assert other.rsplit("/", 1)[1] not in out  # the id is shown shortened
    code, out, _ = run_cli(capsys, "handles", "--json", *common)
    states = {h["handle"]: h["state"] for h in json.loads(out)}
    assert states[handle] == "revoked" and states[other] == "released"
    code, out, err = run_cli(capsys, "read", other, "--idle", "0.5", *common)
    assert code == 0 and out == "" and "the handle was released" in err


def test_consumer_command_errors(served, capsys, monkeypatch):
    monkeypatch.delenv("XSG_TOKEN", raising=False)
    common = ["--url", served.url, "--token", TOKENS["lta"]]
    code, _, err = run_cli(capsys, "read", "weather", *common)
    assert code == 2 and "not a handle: 'weather'" in err
    code, _, err = run_cli(capsys, "read", f"{served.url}/handles/{'Z' * 43}", *common)
    assert code == 1 and "HTTP 404: no such handle" in err and "Z" * 10 not in err
    code, _, err = run_cli(capsys, "handles", "--url", served.url)
    assert code == 2 and "XSG_TOKEN" in err
    code, _, err = run_cli(capsys, "release", f"{served.url}/handles/{'Z' * 43}", *common)
    assert code == 1 and "HTTP 404" in err
    code, _, err = run_cli(capsys, "handles", "--url", "http://127.0.0.1:9", "--token", "t")
    assert code == 1 and "cannot reach the gateway at http://127.0.0.1:9 (from --url)" in err
    code, _, err = run_cli(capsys, "read", "http://127.0.0.1:9/handles/" + "Z" * 43,
                           "--url", "http://127.0.0.1:9", "--token", "t")
    assert code == 1 and "cannot reach the gateway at http://127.0.0.1:9" in err
