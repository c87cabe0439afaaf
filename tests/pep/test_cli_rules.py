"""`xsg policy new`, `show`, `list` and `--what-if` against a running gateway (its HTTP server
on a loopback port; the RecordingRuntime stands in for Spark)."""
from __future__ import annotations

import json

import pytest
import yaml

from pep.cli import main
from tests.console.conftest import POLICIES, TOKENS, start_gateway

XML_REQUEST = (POLICIES / "weather" / "lta-request.xml").read_bytes()

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def gw(tmp_path):
    gateway = start_gateway(tmp_path / "data")
    gateway.add_weather()
    yield gateway
    gateway.close()


def run(capsys, gw, who: str, *argv):
    code = main(["policy", "--url", gw.url, "--token", TOKENS[who], *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_owner_shares_a_stream_from_the_command_line(gw, capsys, tmp_path):
    code, out, err = run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "lta",
                         "--filter", "rainrate > 5", "--attributes", "samplingtime,rainrate",
                         "--window", "tuple:5", "--aggregate", "rainrate:avg",
                         "--description", "LTA sees heavy rain")
    assert code == 0, err
    assert "added urn:xsg:rule:weather:lta version 1.0 (store version 1)" in out
    assert ("grants: weather: lta (read, subscribe) gets avg(rainrate) per tuple window of 5 "
            "every 5, of tuples where rainrate > 5") in out

    code, out, _ = run(capsys, gw, "nea", "list")
    assert "GRANTS" in out.splitlines()[0]
    assert "weather: lta (read, subscribe) gets avg(rainrate) per tuple window" in out
    code, out, _ = run(capsys, gw, "nea", "show", "urn:xsg:rule:weather:lta")
    lines = out.splitlines()
    assert lines[0].startswith("# grants: weather: lta (read, subscribe)")
    assert lines[1].startswith("<?xml") and 'PolicyId="urn:xsg:rule:weather:lta"' in out
    code, out, _ = run(capsys, gw, "nea", "show", "urn:xsg:rule:weather:lta", "--raw")
    assert out.startswith("<?xml")
    code, out, _ = run(capsys, gw, "nea", "show", "urn:xsg:rule:weather:lta", "--rule")
    shown = yaml.safe_load(out)
    assert shown["window"]["aggregates"] == ["rainrate:avg"]
    assert shown["description"] == "LTA sees heavy rain"

    # the rule it shows, edited and written back from a file, is a new version
    shown["filter"] = "rainrate > 6"
    path = tmp_path / "rule.yaml"
    path.write_text(yaml.safe_dump(shown))
    code, out, err = run(capsys, gw, "nea", "update", "urn:xsg:rule:weather:lta", str(path))
    assert code == 0, err
    assert "updated to urn:xsg:rule:weather:lta" in out and "rainrate > 6" in out
    # --xacml prints what a rule compiles to, and stores nothing
    before = gw.services.store.store_version()
    code, out, err = run(capsys, gw, "nea", "new", "--file", str(path), "--id", "urn:draft",
                         "--role", "transport", "--valid-until", "2030-01-01")
    assert code == 0 and "--xacml" not in err
    assert gw.services.store.store_version() == before + 1  # this one was stored
    code, out, err = run(capsys, gw, "nea", "new", "--file", str(path), "--id", "urn:draft2",
                         "--xacml")
    assert code == 0 and out.startswith("<?xml") and 'PolicyId="urn:draft2"' in out
    assert "grants: weather:" in err
    assert gw.services.store.store_version() == before + 1


def test_a_mistake_names_the_field_and_changes_nothing(gw, capsys):
    code, _, err = run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "lta",
                       "--window", "tuple:5", "--aggregate", "rainrate:median")
    assert code == 1 and "HTTP 400" in err and "/window/aggregates/0" in err
    code, _, err = run(capsys, gw, "nea", "new", "--stream", "weather")
    assert code == 1 and "/who" in err
    code, _, err = run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "x",
                       "--window", "tuple")
    assert code == 2 and "TYPE:SIZE" in err
    code, _, err = run(capsys, gw, "lta", "new", "--stream", "weather", "--subject", "x")
    assert code == 1 and "HTTP 403" in err
    assert gw.services.store.store_version() == 0


def test_what_if_before_an_update_or_a_delete(gw, capsys):
    assert run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "lta,other",
               "--attributes", "samplingtime,rainrate")[0] == 0
    for who in ("lta", "other"):
        r = gw.api("POST", "/requests", who, data=XML_REQUEST,
                   headers={"Content-Type": "application/xacml+xml"})
        assert r.status_code == 201, r.text
    before = gw.services.store.store_version()
    code, out, err = run(capsys, gw, "nea", "new", "--replace",
                         "urn:xsg:rule:weather:lta-other", "--id",
                         "urn:xsg:rule:weather:lta-other", "--stream", "weather", "--subject",
                         "lta", "--attributes", "samplingtime,rainrate", "--what-if")
    assert code == 0, err
    assert "2 live handles would be re-decided: 1 revoked, 0 changed" in out
    assert "  revoked  other on weather (1 handle)" in out
    assert "  kept     lta on weather (1 handle)" in out
    assert out.rstrip().endswith("nothing was changed (dry run)")
    code, out, _ = run(capsys, gw, "nea", "delete", "urn:xsg:rule:weather:lta-other",
                       "--what-if")
    assert code == 0 and "2 revoked" in out
    assert gw.services.store.store_version() == before and len(gw.services.handles.live()) == 2
    code, out, _ = run(capsys, gw, "nea", "list", "--json")
    assert json.loads(out)[0]["form"] == "rule"


def test_masks_from_flags(gw, capsys):
    code, out, err = run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "lta",
                         "--mask", "rainrate:round:5", "--mask", "samplingtime:truncate:hour",
                         "--xacml")
    assert code == 0, err
    assert "exacml:obligation:stream-mask" in out and "rainrate:round:5" in out
    assert "rainrate as round:5, samplingtime as truncate:hour" in err
    code, _, err = run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "lta",
                       "--mask", "rainrate")
    assert code == 2 and "ATTR:MASK" in err
    code, _, err = run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "lta",
                       "--mask", "rainrate:hash")
    assert code == 1 and "HTTP 400" in err and "/mask/rainrate" in err


def test_the_grant_option_and_a_derived_stream_from_the_command_line(gw, capsys):
    code, out, err = run(capsys, gw, "nea", "new", "--stream", "weather", "--subject", "lta",
                         "--attributes", "samplingtime,rainrate", "--grant-option")
    assert code == 0, err
    assert "gets samplingtime, rainrate, with grant option" in out
    r = gw.api("POST", "/requests", who="lta", data=XML_REQUEST,
               headers={"Content-Type": "application/xacml+xml"})
    assert r.status_code == 201 and r.json()["grant_option"] is True, r.text

    def stream(who: str, *argv):
        code = main(["stream", "--url", gw.url, "--token", TOKENS[who], *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = stream("lta", "derive", r.json()["handle"], "lta-weather")
    assert code == 0, err
    assert out.splitlines()[0] == "derived lta-weather from weather: owned by lta, restricted"
    assert "samplingtime (timestamp), rainrate (double)" in out
    code, out, _ = stream("lta", "derivation", "lta-weather")
    assert json.loads(out)["source"] == "weather"
    # the same handle again, and a handle that is not the caller's: the gateway's reason
    code, _, err = stream("lta", "derive", r.json()["id"], "lta-weather2")
    assert code != 0 and "already feeds derived stream 'lta-weather'" in err
    code, _, err = stream("other", "derive", r.json()["id"], "x")
    assert code != 0 and "HTTP 404" in err
