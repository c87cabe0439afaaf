"""HTTP of the stream catalogue (Flask test client, real authenticator, no Spark)."""
from __future__ import annotations

import json

import pytest
from flask import Flask

from common.auth import Identity, TokenAuthenticator
from common.http.auth import install_authenticator
from pep.http import errors
from pep.http.streams import install_streams
from pep.streams.catalog import StreamCatalog
from pep.streams.definition import SEQ_FIELD

TOKENS = {"nea": "t-nea", "lta": "t-lta", "root": "t-root", "own2": "t-own2"}


@pytest.fixture
def client(tmp_path):
    catalog = StreamCatalog(tmp_path / "s.db", tmp_path / "d")
    app = Flask("t")
    install_authenticator(app, TokenAuthenticator([
        ("t-nea", Identity("nea", ("data-owner",))),
        ("t-lta", Identity("lta", ("consumer",))),
        ("t-root", Identity("root", (), admin=True)),
        ("t-own2", Identity("own2", ("data-owner",))),
    ]))
    errors.install(app)
    install_streams(app, catalog)
    yield app.test_client(), catalog
    catalog.close()


def h(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


WEATHER = {"name": "weather", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
           "schema": [{"name": "samplingtime", "type": "timestamp"},
                      {"name": "rainrate", "type": "double"}]}


def test_register_list_get(client):
    c, catalog = client
    assert c.post("/streams", json=WEATHER).status_code == 401
    r = c.post("/streams", json=WEATHER, headers=h("lta"))
    assert r.status_code == 403
    r = c.post("/streams", json=WEATHER, headers=h("nea"))
    assert r.status_code == 201, r.json
    assert r.json["owner"] == "nea" and r.headers["Location"] == "/streams/weather"
    assert r.json["source"]["path"].endswith("weather/ingest")
    assert c.post("/streams", json=WEATHER, headers=h("own2")).status_code == 409
    listed = c.get("/streams", headers=h("lta")).json["streams"]
    assert [s["name"] for s in listed] == ["weather"] and listed[0]["source"] == {"kind": "ingest"}
    assert c.get("/streams/weather", headers=h("lta")).json["schema"][1] == {
        "name": "rainrate", "type": "double"}
    assert "path" in c.get("/streams/weather", headers=h("nea")).json["source"]
    assert c.get("/streams/nope", headers=h("lta")).status_code == 404


@pytest.mark.parametrize("body, status, fragment", [
    ("not json", 400, "JSON object"),
    ({**WEATHER, "evil": 1}, 400, "unknown key"),
    ({**WEATHER, "name": "../etc"}, 400, "stream name"),
    ({**WEATHER, "schema": [{"name": "a", "type": "blob"}]}, 400, "type must be"),
    ({**WEATHER, "source": {"kind": "files", "path": "/etc"}}, 403, "administrators"),
])
def test_register_errors(client, body, status, fragment):
    c, _ = client
    kw = {"data": body, "content_type": "application/json"} if isinstance(body, str) \
        else {"json": body}
    r = c.post("/streams", headers=h("nea"), **kw)
    assert r.status_code == status and fragment in r.json["error"]


def test_admin_may_register_files_source(client, tmp_path):
    c, _ = client
    r = c.post("/streams", headers=h("root"),
               json={**WEATHER, "source": {"kind": "files", "path": str(tmp_path)}})
    assert r.status_code == 201 and r.json["owner"] == "root"


def test_records(client):
    c, catalog = client
    c.post("/streams", json=WEATHER, headers=h("nea"))
    good = b'{"samplingtime": "2024-05-01T10:00:00Z", "rainrate": 6}\n' * 3
    nd = {"Content-Type": "application/x-ndjson"}
    assert c.post("/streams/weather/records", data=good, headers=h("lta", **nd)).status_code == 403
    assert c.post("/streams/weather/records", data=good, headers=h("own2", **nd)).status_code == 403
    assert c.post("/streams/nope/records", data=good, headers=h("nea", **nd)).status_code == 404
    r = c.post("/streams/weather/records", data=good, headers=h("nea", **nd))
    assert r.status_code == 201 and r.json == {"stream": "weather", "appended": 3}
    r = c.post("/streams/weather/records", data=good, headers=h("root", **nd))
    assert r.status_code == 201
    bad = good + b'{"samplingtime": "2024-05-01T10:00:00Z", "rainrate": "heavy"}\n'
    r = c.post("/streams/weather/records", data=bad,
               headers=h("nea", **{"Content-Type": "application/json"}))
    assert r.status_code == 400
    assert r.json["line"] == 4 and r.json["field"] == "rainrate"
    assert "line 4" in r.json["error"] and "expected a number" in r.json["error"]
    r = c.post("/streams/weather/records", data=good,
               headers=h("nea", **{"Content-Type": "application/xml"}))
    assert r.status_code == 415
    files = sorted(catalog.ingest_dir("weather").iterdir())
    seqs = [json.loads(x)[SEQ_FIELD] for f in files for x in f.read_text().splitlines()]
    assert seqs == [1, 2, 3, 4, 5, 6]


def test_register_refuses_deep_nesting_and_non_json_media(client):
    # issue 9, item 4: Flask's get_json recursed into a RecursionError (a 500)
    c, _ = client
    r = c.post("/streams", data=b"[" * 50_000 + b"]" * 50_000, headers=h("nea"),
               content_type="application/json")
    assert r.status_code == 400 and "nests deeper than" in r.json["error"]
    r = c.post("/streams", data=json.dumps(WEATHER), headers=h("nea"), content_type="text/plain")
    assert r.status_code == 415 and "application/json" in r.json["error"]
