"""ASSIST Table 2 end to end (issues 14 and 27): rows 1, 2, 4, 5 and 6 as the rules of
policies/ais/port-authority-policy.xml and row 3, the join, as policies/joins/routes-policy.xml,
enforced by the real gateway over HTTP on real Spark.

An ingest-fed stream `ais` with the AIS generator's schema carries deterministic synthetic ships
around the port of Singapore (ships crossing the port waters' edges and the 50 and 200 nautical
mile circles, the captain's own ship sailing east through the others), so a brute-force
recomputation in plain Python knows every tuple. The geometry of that recomputation is the
test's own (haversine with atan2, crossing-number polygon test): nothing from pep.core.geo.
Consumers with the right subjects (their port, ship list, own ship: from the auth file) open
handles over HTTP and read NDJSON; their rows must equal the recomputation value by value:
- row 1: the port authority reads every attribute inside its port polygon;
- row 2: it counts reports within 50 nm of its port, 600 s windows, per ship type;
- row 4: a ship company reads its own ships;
- row 5: a captain reads mmsi, lon, lat within 200 nm of his moving ship (DISTANCE_TO);
- rows 5 and 6: with the ais stream's grants combined by union (its owner's setting), a
  captain reads the union of both while the emergency (a stream event) lasts: ships within 200
  nm with mmsi, lon, lat, ships in the emergency with every attribute; the view changes when the
  event opens and closes (the handle is revoked, asked again it gets the view in force);
- row 3: routes only through the join (a grant for a join only): routes alone is refused, the
  join's rows equal a brute-force join of both sides' authorised views.
- masks (the read-traffic rule of the same policy): the port authority sees the other ships
  (outside its waters) on a 0.1 degree grid, by a keyed hash of the MMSI, speeds in bands, the
  time to the minute; checked against masks applied here, with the owner's key.
Leaks tried, per row: subject attributes claimed in the request file (in the subject, resource
and environment categories), a wider polygon or circle in the consumer's own query, a subject
without the attribute a rule needs, finer or regrouped windows, hidden attributes, another
anchor, and the emergency view outside an emergency or for another role.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from datetime import UTC, datetime
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
import requests

from pep.config import DEMO_PORT
from tests.e2e.conftest import Reader, added_subjects, auth

POLICY = Path(__file__).resolve().parents[2] / "policies" / "ais" / "port-authority-policy.xml"
S = "http://www.w3.org/2001/XMLSchema#string"
D = "http://www.w3.org/2001/XMLSchema#double"
INT = "http://www.w3.org/2001/XMLSchema#integer"
B = "http://www.w3.org/2001/XMLSchema#boolean"
SUBJECT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ENVIRONMENT = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
T0 = 1_714_550_400  # 2024-05-01T08:00:00Z, a multiple of 600
STEP = 30  # seconds between a ship's reports
STEPS = 50  # 25 minutes: windows [0, 600), [600, 1200) close, [1200, 1800) stays open
SHIPS = range(1, 13)
CAPTAIN_SHIP = 244000007
COMPANY_SHIPS = [244000001, 244000003, 244000005]
EMERGENCY_SHIP = 244000011
BOUNDS = DEMO_PORT["port-bounds"]
PORT = (DEMO_PORT["port-lat"], DEMO_PORT["port-lon"])
NM = 1852.0
ROW2_RADIUS, ROW5_RADIUS = 50 * NM, 200 * NM
EARTH_RADIUS = 6_371_008.8  # metres, the mean radius the README names
INNER = [1.2003, 103.7103, 1.2003, 103.9497, 1.2697, 103.9497, 1.2697, 103.7103]  # in the port
WORLD = [-89.0, -179.0, -89.0, 179.0, 89.0, 179.0, 89.0, -179.0]
TYPES = ("cargo", "tanker", "passenger", "fishing", "tug")
HOLD = 20.0  # seconds an emergency lasts after its last report (loaded machines: 10 s batches)
SUBJECTS = {  # subject: (roles, attributes)
    "mpa": (["port-authority"], DEMO_PORT),
    "mpa-claims": (["port-authority"], DEMO_PORT),
    "mpa-stats": (["port-authority"], DEMO_PORT),
    "mpa-ops": (["port-authority"], DEMO_PORT),
    "mpa-noport": (["port-authority"], {}),
    "mpa-traffic": (["port-authority"], DEMO_PORT),
    "shipco": (["ship-company"], {"ship-list": COMPANY_SHIPS}),
    "shipco-claims": (["ship-company"], {"ship-list": COMPANY_SHIPS}),
    "shipco-none": (["ship-company"], {}),
    "captain": (["ship-captain"], {"ship-mmsi": CAPTAIN_SHIP}),
    "captain-wide": (["ship-captain"], {"ship-mmsi": CAPTAIN_SHIP}),
    "captain2": (["ship-captain"], {"ship-mmsi": 244000002}),
    "captain-noship": (["ship-captain"], {}),
}
SCHEMA = [{"name": n, "type": t} for n, t in (
    ("mmsi", "long"), ("shipname", "string"), ("shiptype", "string"), ("lat", "double"),
    ("lon", "double"), ("speed", "double"), ("course", "double"), ("ts", "timestamp"))]
XML = "application/xacml+xml"


# -- the test's own geometry ------------------------------------------------------------------

def metres(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance on the mean-radius sphere (haversine, atan2 form)."""
    f1, f2 = math.radians(lat1), math.radians(lat2)
    df, dl = f2 - f1, math.radians(lon2 - lon1)
    h = math.sin(df / 2) ** 2 + math.cos(f1) * math.cos(f2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS * math.atan2(math.sqrt(h), math.sqrt(1 - h))


def vertices(flat: list[float]) -> list[tuple[float, float]]:
    return list(zip(flat[0::2], flat[1::2], strict=True))


def inside(lat: float, lon: float, flat: list[float]) -> bool:
    """Crossing number of a ray towards east over straight lat/lon edges."""
    pts = vertices(flat)
    crossings = 0
    for (y1, x1), (y2, x2) in zip(pts, pts[1:] + pts[:1], strict=True):
        if (y1 > lat) != (y2 > lat):
            x_at = x1 + (lat - y1) * (x2 - x1) / (y2 - y1)
            if lon < x_at:
                crossings += 1
    return crossings % 2 == 1


def edge_gap(lat: float, lon: float, flat: list[float]) -> float:
    """Plane distance in degrees from (lat, lon) to the polygon's nearest edge."""
    pts = vertices(flat)
    best = math.inf
    for (y1, x1), (y2, x2) in zip(pts, pts[1:] + pts[:1], strict=True):
        dy, dx = y2 - y1, x2 - x1
        t = max(0.0, min(1.0, ((lat - y1) * dy + (lon - x1) * dx) / (dy * dy + dx * dx)))
        best = min(best, math.hypot(lat - (y1 + t * dy), lon - (x1 + t * dx)))
    return best


# -- the data ---------------------------------------------------------------------------------

def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# Each ship's track: start (lat, lon) and move per step. Ships 1-6 sail around and across the
# port waters and the 50 nm circle; 8-12 further out; the captain's ship (7) sails east from
# the Strait of Malacca past all of them, so its 200 nm circle sweeps over the others.
TRACKS = {
    1: ((1.05, 103.70), (0.008, 0.0)),     # north across the port waters
    2: ((1.22, 103.411), (0.0, 0.02)),     # east across them
    3: ((1.25, 103.90), (0.001, -0.002)),  # stays inside
    4: ((1.40, 104.20), (-0.006, -0.01)),  # from the north-east into them
    5: ((1.10, 104.30), (0.0, -0.015)),    # south of them, inside 50 nm
    6: ((2.30, 103.84), (-0.02, 0.0)),     # from 140 nm north into the 50 nm circle
    7: ((1.05, 101.00), (0.004, 0.12)),    # the captain's own ship
    8: ((1.30, 106.00), (0.0, 0.03)),
    9: ((0.50, 102.50), (0.005, 0.01)),
    10: ((3.50, 104.00), (-0.01, 0.02)),
    11: ((1.00, 105.00), (0.002, -0.004)),
    12: ((-1.00, 108.00), (0.01, -0.05)),
}


def position(i: int, k: int) -> tuple[float, float]:
    """Ship i at step k (rounded as an AIS report would be)."""
    (lat, lon), (dlat, dlon) = TRACKS[i]
    return round(lat + dlat * k, 5), round(lon + dlon * k, 5)


def make_records(first_step: int, steps: int, speed: float | None = None,
                 only: int | None = None) -> list[dict]:
    out = []
    for k in range(first_step, first_step + steps):
        for i in SHIPS:
            mmsi = 244000000 + i
            if only is not None and mmsi != only:
                continue
            lat, lon = position(i, k)
            out.append({"mmsi": mmsi, "shipname": f"VESSEL-{i:02d}", "shiptype": TYPES[i % 5],
                        "lat": lat, "lon": lon,
                        "speed": speed if speed is not None else round(5 + (i * k) % 13 * 0.7, 2),
                        "course": float((i * 37 + k) % 360), "ts": iso(T0 + k * STEP + i)})
    return out


def anchors(records: list[dict], mmsi: int) -> list[tuple[float, float] | None]:
    """For each record, the latest position `mmsi` reported strictly before it (stream order)."""
    out, last = [], None
    for r in records:
        out.append(last)
        if r["mmsi"] == mmsi:
            last = (r["lat"], r["lon"])
    return out


def expected_rows(records: list[dict]) -> dict[str, list[dict]]:
    """The brute force: every row each consumer may see, in stream order."""
    out: dict[str, list[dict]] = {"mpa": [], "shipco": [], "captain": [], "mpa-ops": []}
    for r, anchor in zip(records, anchors(records, CAPTAIN_SHIP), strict=True):
        if inside(r["lat"], r["lon"], BOUNDS):
            out["mpa"].append(dict(r))
            if inside(r["lat"], r["lon"], INNER):
                out["mpa-ops"].append(dict(r))
        if r["mmsi"] in COMPANY_SHIPS:
            out["shipco"].append(dict(r))
        if anchor is not None and metres(r["lat"], r["lon"], *anchor) <= ROW5_RADIUS:
            out["captain"].append({"mmsi": r["mmsi"], "lon": r["lon"], "lat": r["lat"]})
    # the leak attempts must see exactly what their honest twins see
    out["mpa-claims"] = out["mpa"]
    out["shipco-claims"] = out["shipco"]
    out["captain-wide"] = out["captain"]
    return out


def expected_counts(records: list[dict]) -> set[tuple[str, str, int]]:
    """Row 2: reports within 50 nm of the port per (600 s window, ship type), windows the
    watermark (the largest event time) has passed, at least 3 reports (the default)."""
    watermark = max(epoch(r["ts"]) for r in records)
    counts: dict[tuple[int, str], int] = {}
    for r in records:
        if metres(r["lat"], r["lon"], *PORT) <= ROW2_RADIUS:
            key = (int(epoch(r["ts"]) // 600), r["shiptype"])
            counts[key] = counts.get(key, 0) + 1
    return {(iso(k * 600), t, c) for (k, t), c in counts.items()
            if (k + 1) * 600 <= watermark and c >= 3}


def near_a_boundary(records: list[dict]) -> list:
    """Tuples within rounding reach of a circle or a polygon edge (two implementations of the
    geometry may differ in the last bits there): the data must have none, or a comparison
    would be luck."""
    bad = []
    for r, anchor in zip(records, anchors(records, CAPTAIN_SHIP), strict=True):
        if abs(metres(r["lat"], r["lon"], *PORT) - ROW2_RADIUS) < 1.0:
            bad.append(("row 2 circle", r))
        if anchor and abs(metres(r["lat"], r["lon"], *anchor) - ROW5_RADIUS) < 1.0:
            bad.append(("row 5 circle", r))
        for name, poly in (("port", BOUNDS), ("inner", INNER)):
            if edge_gap(r["lat"], r["lon"], poly) < 1e-7:
                bad.append((name, r))
    return bad


# -- HTTP -------------------------------------------------------------------------------------

def request_body(action: str, query: str | None = None, claims: tuple = ()) -> bytes:
    """A XACML request for `ais`; `claims` are (category, attribute id, datatype, values)
    the request file asserts (the gateway must ignore every one that could matter)."""
    def attrs(category: str) -> str:
        return "".join(
            f'<Attribute AttributeId="{a}" IncludeInResult="false">'
            + "".join(f'<AttributeValue DataType="{t}">{v}</AttributeValue>' for v in values)
            + "</Attribute>" for c, a, t, values in claims if c == category)
    content = "" if query is None else (
        f'<Content><UserQuery xmlns=""><Filter><FilterCondition>{escape(query)}'
        f'</FilterCondition></Filter></UserQuery></Content>')
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="{SUBJECT}">{attrs(SUBJECT)}</Attributes>
      <Attributes Category="{RESOURCE}">{content}
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
          IncludeInResult="false"><AttributeValue DataType="{S}">ais</AttributeValue>
        </Attribute>{attrs(RESOURCE)}</Attributes>
      <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:action">
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:action:action-id"
          IncludeInResult="false"><AttributeValue DataType="{S}">{action}</AttributeValue>
        </Attribute></Attributes>
      <Attributes Category="{ENVIRONMENT}">{attrs(ENVIRONMENT)}</Attributes></Request>""".encode()


def claim_everywhere(attribute: str, datatype: str, values: list) -> tuple:
    """The same claim in the subject and the resource category, by short and full id."""
    return tuple((c, a, datatype, values) for c in (SUBJECT, RESOURCE)
                 for a in (attribute, f"urn:xsg:attr:{attribute}"))


def ask(base: str, who: str, action: str, query: dict | None = None, where: str = "/requests",
        claims: tuple = ()):
    body = request_body(action, claims=claims)
    if query is None:
        return requests.post(f"{base}{where}", data=body, timeout=30,
                             headers=auth(who, **{"Content-Type": XML}))
    return requests.post(f"{base}{where}", headers=auth(who), timeout=30, files={
        "request": ("r.xml", body, XML),
        "query": ("q.json", json.dumps(query), "application/json")})


def explain(base: str, who: str, action: str, query: dict | None = None, claims: tuple = ()):
    return ask(base, who, action, query, where="/explain", claims=claims)


def ingest(base: str, records: list[dict]) -> None:
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    r = requests.post(f"{base}/streams/ais/records", data=body, timeout=30,
                      headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
    assert r.status_code == 201, r.text


def wait_for(predicate, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def error(r) -> str:
    try:
        doc = r.json()
    except ValueError:
        return r.text
    return str(doc.get("error") or doc.get("detail") or doc)


@pytest.fixture(scope="module")
def table2(gateway):
    """The ais stream, the Table 2 policy, its subjects in the auth file, the emergency event."""
    base = gateway.url
    subjects = {s: {"roles": roles, **({"attributes": attributes} if attributes else {})}
                for s, (roles, attributes) in SUBJECTS.items()}
    with added_subjects(gateway, subjects):
        try:
            r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
                "name": "ais", "time_attribute": "ts", "source": {"kind": "ingest"},
                "schema": SCHEMA})
            assert r.status_code == 201, r.text
            r = requests.post(f"{base}/policies", data=POLICY.read_bytes(), timeout=30,
                              headers=auth("nea", **{"Content-Type": XML}))
            assert r.status_code == 201, r.text
            r = requests.post(f"{base}/streams/ais/events", headers=auth("nea"), timeout=30, json={
                "name": "emergency", "condition": "speed >= 30", "key": "mmsi", "hold": HOLD})
            assert r.status_code == 201, r.text
            yield base
        finally:
            requests.delete(f"{base}/policies/urn:xsg:example:ais:port-authority-policy",
                            headers=auth("nea"), timeout=30)


# -- rows 1, 2, 4, 5 on Spark against the brute force -------------------------------------------

HANDLES = [  # (subject, action, the consumer's own query, the request file's claims)
    ("mpa", "read", None, ()),
    # row 1 leak: the request claims a port covering the world; the rows stay the port's
    ("mpa-claims", "read", None, claim_everywhere("port-bounds", D, WORLD)),
    ("mpa-stats", "aggregate", None,
     claim_everywhere("port-lat", D, [1.0]) + claim_everywhere("port-lon", D, [100.0])),
    ("mpa-ops", "read", {"filter": f"WITHIN_POLYGON(lat, lon, {INNER})"}, ()),
    ("shipco", "read", None, ()),
    # row 4 leak: the request claims every ship for the company's list
    ("shipco-claims", "read", None,
     claim_everywhere("ship-list", INT, [244000000 + i for i in SHIPS])),
    ("captain", "read", None, ()),
    # row 5 leak: a wider circle in the captain's own query, and another ship claimed as his
    ("captain-wide", "read", {"filter": "DISTANCE_TO(lat, lon, mmsi, 244000007) <= 2000000"},
     claim_everywhere("ship-mmsi", INT, [244000012])),
]


@pytest.mark.timeout(150)
def test_rows_1_2_4_5_match_a_brute_force_recomputation(table2):
    base = table2
    started = time.monotonic()
    records = make_records(0, STEPS)
    assert near_a_boundary(records) == []
    want = expected_rows(records)
    counts = expected_counts(records)
    # the data exercises every side of every predicate
    assert 0 < len(want["mpa-ops"]) < len(want["mpa"]) < len(records)
    assert 0 < len(want["captain"]) < len(records)
    assert 0 < len(want["shipco"]) < len(records)
    in_port = {r["mmsi"] for r in want["mpa"]}
    assert any(r["mmsi"] in in_port and not inside(r["lat"], r["lon"], BOUNDS)
               for r in records)  # ships cross the port's edge
    near = {r["mmsi"] for r in want["captain"]}
    assert any(r["mmsi"] in near and metres(r["lat"], r["lon"], *anchor) > ROW5_RADIUS
               for r, anchor in zip(records, anchors(records, CAPTAIN_SHIP), strict=True) if anchor)
    assert any(metres(r["lat"], r["lon"], *PORT) > ROW2_RADIUS for r in records)
    assert len(near) > 3 and len(counts) >= 4
    readers = {}
    handles = {}
    for who, action, query, claims in HANDLES:
        r = ask(base, who, action, query, claims=claims)
        assert r.status_code == 201, (who, r.text)
        doc = r.json()
        filter_warnings = [w for w in doc["warnings"] if w["operator"] == "filter"]
        if who == "mpa-ops":  # the consumer's polygon lies in the (convex) port waters: no PR
            assert filter_warnings == [], doc
            assert "WITHIN_POLYGON" in doc["sql"]
        if who in ("captain", "captain-wide"):
            assert "DISTANCE_TO(`lat`, `lon`, `mmsi`, 244000007) <= 370400" in doc["sql"]
            assert "244000012" not in doc["sql"]
        if who == "captain-wide":  # the wider circle is partial, said so, and not granted
            assert [w["kind"] for w in filter_warnings] == ["PR"], doc
        if who == "mpa-stats":  # the port is the caller's, not the request's
            assert "1.264, 103.84" in doc["sql"] and "100.0" not in doc["sql"], doc["sql"]
        handles[who] = doc["handle"]
        readers[who] = Reader(doc["handle"], who).start()
    for n in range(0, len(records), 150):  # several micro-batches: the anchor crosses them
        ingest(base, records[n:n + 150])
        time.sleep(0.3)
    wanted = {**{w: len(want[w]) for w in readers if w != "mpa-stats"}, "mpa-stats": len(counts)}
    assert wait_for(lambda: all(len(readers[w].rows) >= wanted[w] for w in readers), 60), \
        {w: (len(readers[w].rows), wanted[w]) for w in readers}
    time.sleep(1.0)  # nothing more may arrive
    for who in readers:
        if who != "mpa-stats":
            assert readers[who].rows == want[who], who
    got = {(r["window_start"], r["shiptype"], r["count_mmsi"]) for r in readers["mpa-stats"].rows}
    assert got == counts
    assert len(readers["mpa-stats"].rows) == len(counts)
    assert all(set(r) == {"window_start", "window_end", "shiptype", "count_mmsi"}
               for r in readers["mpa-stats"].rows)
    for who, url in handles.items():
        assert requests.delete(url, headers=auth(who), timeout=30).status_code in (200, 204)
    assert time.monotonic() - started < 90


# -- what each row refuses (decided, nothing started) -------------------------------------------

@pytest.mark.timeout(60)
def test_each_row_refuses_what_it_does_not_grant(table2):
    base = table2
    # row 1: no port of its own, no view, whatever the request claims
    r = ask(base, "mpa-noport", "read", claims=claim_everywhere("port-bounds", D, WORLD))
    assert r.status_code == 403 and "port-bounds" in error(r), r.text
    # row 2: windows finer than 10 minutes, other group-by keys, hidden attributes, a filter
    # before the window: refused and named; no port: no count
    for query, named in [
            ({"window": {"type": "time", "size": 300, "step": 300,
                         "aggregates": ["mmsi:count"]}}, "size"),
            ({"window": {"type": "time", "size": 600, "step": 300,
                         "aggregates": ["mmsi:count"]}}, "step"),
            ({"window": {"type": "time", "size": 600, "step": 600, "aggregates": ["mmsi:count"],
                         "keys": ["mmsi"]}}, "mmsi"),
            ({"window": {"type": "time", "size": 600, "step": 600,
                         "aggregates": ["speed:avg"]}}, "speed"),
            ({"filter": "DISTANCE(lat, lon, 1.264, 103.84) <= 100",
              "window": {"type": "time", "size": 600, "step": 600,
                         "aggregates": ["mmsi:count"]}}, "lat")]:
        r = ask(base, "mpa-stats", "aggregate", query)
        assert r.status_code == 403 and named in error(r), (query, r.text)
    r = ask(base, "mpa-noport", "aggregate")
    assert r.status_code == 403 and "port-lat" in error(r), r.text
    # row 4: another company's ship is no result (nothing started), no list is nothing at all
    r = ask(base, "shipco", "read", {"filter": "mmsi = 244000002"})
    assert r.status_code == 422, r.text
    r = explain(base, "shipco-none", "read",
                claims=claim_everywhere("ship-list", INT, [244000002]))
    assert r.status_code == 200, r.text  # an empty list: the filter passes nothing
    assert r.json()["plan"]["filter"] == [] and "244000002" not in r.text, r.text
    r = ask(base, "shipco-none", "read", claims=claim_everywhere("ship-list", INT, [244000002]))
    assert r.status_code == 422, r.text
    # row 5: hidden attributes, another anchor, no ship of one's own
    r = ask(base, "captain", "read", {"map": ["mmsi", "shipname"]})
    assert r.status_code == 403 and "shipname" in error(r), r.text
    r = ask(base, "captain", "read", {"filter": "DISTANCE_TO(lat, lon, mmsi, 244000001) <= 1"})
    assert r.status_code == 403 and "anchor" in error(r), r.text
    r = ask(base, "captain-noship", "read", claims=claim_everywhere("ship-mmsi", INT, [244000007]))
    assert r.status_code == 403 and "ship-mmsi" in error(r), r.text
    # row 6: the emergency view is a captain's, and only during an emergency
    r = ask(base, "shipco", "read-emergency")
    assert r.status_code == 403, r.text


@pytest.mark.timeout(60)
def test_a_consumer_narrowing_row_1_gets_pr_and_nr_warnings(table2):
    base = table2

    def explained(query: str) -> dict:
        r = requests.post(f"{base}/explain", data=request_body("read", query), timeout=30,
                          headers=auth("mpa-ops", **{"Content-Type": XML}))
        assert r.status_code == 200, r.text
        return r.json()

    narrower = explained(f"WITHIN_POLYGON(lat, lon, {INNER})")
    assert [w["kind"] for w in narrower["warnings"]] == []
    wider = explained(f"WITHIN_POLYGON(lat, lon, {WORLD})")  # asks for more: PR, not granted
    assert [w["kind"] for w in wider["warnings"] if w["operator"] == "filter"] == ["PR"]
    assert "ARRAY(1.15, 103.6, 1.13" in wider["sql"]  # the port's own polygon still applies
    poking = explained("DISTANCE(lat, lon, 1.31, 103.80) <= 5000")  # reaches north of the port
    (pr,) = [w for w in poking["warnings"] if w["operator"] == "filter"]
    assert pr["kind"] == "PR" and "cannot decide exactly" in pr["message"]
    assert "WITHIN_POLYGON(lat, lon, [1.15, 103.6" in pr["message"]  # the bound port bounds
    contained = explained("DISTANCE(lat, lon, 1.22, 103.80) <= 2000")
    assert [w for w in contained["warnings"] if w["operator"] == "filter"] == []
    r = ask(base, "mpa-ops", "read", {"filter": "DISTANCE(lat, lon, 5.0, 100.0) <= 10000"})
    assert r.status_code == 422 and "no tuple" in r.text, r.text
    r = ask(base, "mpa-ops", "read", {"filter": "DISTANCE(lat, lon, 1e308, 100.0) <= 10000"})
    assert r.status_code == 400 and "not a latitude" in error(r), r.text


# -- rows 5 and 6: the captain's union, opened and closed by an event ---------------------------

def union_rows(anchor_records: list[dict], records: list[dict], keys: set[int]) -> list[dict]:
    """The brute force of ASSIST's Secure Read for the captain of ship 2: a tuple within 200 nm
    of the ship's latest position before it (row 5: mmsi, lon, lat) or of a ship in the
    emergency (row 6: every attribute); both: every attribute; neither: nothing."""
    out = []
    seen = anchor_records + records
    for r, anchor in list(zip(seen, anchors(seen, 244000002), strict=True))[len(anchor_records):]:
        row6 = r["mmsi"] in keys
        row5 = anchor is not None and metres(r["lat"], r["lon"], *anchor) <= ROW5_RADIUS
        if row6:
            out.append(dict(r))
        elif row5:
            out.append({"mmsi": r["mmsi"], "lat": r["lat"], "lon": r["lon"]})
    return out


@pytest.mark.timeout(150)
def test_rows_5_and_6_the_captain_reads_their_union_while_an_emergency_lasts(table2):
    base = table2
    r = requests.patch(f"{base}/streams/ais", json={"combining": "union"}, timeout=30,
                       headers=auth("nea"))
    assert r.status_code == 200 and r.json()["combining"] == "union", r.text
    r = requests.patch(f"{base}/streams/ais", json={"combining": "all"}, timeout=30,
                       headers=auth("nea"))
    assert r.status_code == 400 and "combining" in error(r), r.text
    assert requests.patch(f"{base}/streams/ais", json={"combining": None}, timeout=30,
                          headers=auth("captain2")).status_code in (403, 404)
    # no emergency, whatever the request says about the environment: row 5 alone
    forged = ((ENVIRONMENT, "urn:xsg:event:ais:emergency", B, ["true"]),
              (ENVIRONMENT, "urn:xsg:event:ais:emergency:keys", S, ["244000001"]))
    r = ask(base, "captain2", "read", claims=forged)
    assert r.status_code == 201, r.text
    assert "union of" not in r.json()["sql"] and "244000001" not in r.json()["sql"]
    before = Reader(r.json()["handle"], "captain2").start()
    assert explain(base, "shipco", "read").json()["sql"].count("DISTANCE_TO") == 0
    ingest(base, make_records(100, 1, speed=35.0, only=EMERGENCY_SHIP))  # it begins
    # the captain's grants changed (row 6 applies now): the handle is revoked, at once
    assert before.done.wait(20), before.lines
    assert before.lines[-1]["event"] == "revoked"
    r = ask(base, "captain2", "read")
    assert r.status_code == 201, r.text
    doc = r.json()
    assert "union of 2 grants" in doc["sql"] and "`mmsi` = 244000011" in doc["sql"]
    assert len(doc["plan"]["union"]) == 2
    assert ask(base, "captain2", "read").json()["id"] == doc["id"]  # one window: the same
    reader = Reader(doc["handle"], "captain2").start()
    # the captain's own ship reports first (its position is the anchor of row 5), with the
    # ship in emergency, still racing; then every ship
    anchor = make_records(101, 1, speed=35.0, only=EMERGENCY_SHIP)
    anchor.insert(0, make_records(101, 1, only=244000002)[0])
    later = make_records(102, 3)
    for rec in later:
        if rec["mmsi"] == EMERGENCY_SHIP:
            rec["speed"] = 35.0
    ingest(base, anchor)
    ingest(base, later)
    last_match = time.monotonic()
    keys = {EMERGENCY_SHIP}
    later = anchor[1:] + later
    anchor = anchor[:1]
    want = union_rows(anchor, later, keys)
    assert any(len(w) == 3 for w in want) and any(len(w) == len(SCHEMA) for w in want)
    assert len(want) < len(later)
    anchor_row = {"mmsi": 244000002, "lat": anchor[0]["lat"], "lon": anchor[0]["lon"]}

    def got():  # the anchor's own report depends on what the stream knew before: left out
        return [row for row in reader.rows if row != anchor_row]
    assert wait_for(lambda: len(got()) >= len(want), 20), (len(got()), len(want), reader.lines)
    assert got()[:len(want)] == want
    assert reader.done.wait(HOLD + 12), reader.lines  # the event closes: row 6 no longer
    assert reader.lines[-1]["event"] == "revoked"
    assert got() == want
    took = reader.final_at - last_match
    assert HOLD - 0.5 <= took <= HOLD + 10, took  # on time: the hold, a batch and a tick
    r = ask(base, "captain2", "read", claims=forged)
    assert r.status_code == 201 and "union of" not in r.json()["sql"], r.text
    assert requests.delete(r.json()["handle"], headers=auth("captain2"),
                           timeout=30).status_code in (200, 204)


# -- row 3: routes only through the join ----------------------------------------------------------

ROUTES_POLICY = POLICY.parents[1] / "joins" / "routes-policy.xml"
JOIN_REQUEST = POLICY.parents[1] / "joins" / "port-authority-join-request.xml"
LEGS = ("Los Angeles", "naval-base", "Busan", "Los Angeles")


def route_reports(ais: list[dict]) -> list[dict]:
    """A route report 4 s after some AIS reports of each ship: legs and free loads varied."""
    out = []
    for n, r in enumerate(ais):
        if n % 3:
            continue
        out.append({"mmsi": r["mmsi"], "next_leg": LEGS[(r["mmsi"] + n) % 4],
                    "free_load": (n * 7) % 25, "eta": iso(T0 + 86400 + n),
                    "consignee": f"client-{n}", "ts": iso(epoch(r["ts"]) + 4)})
    return out


def expected_join(ais: list[dict], routes: list[dict], within: float) -> list[tuple]:
    """Row 1 (port waters) and the grant's polygon on AIS; the routes policy (no naval leg, no
    consignee) and the consumer's filter on routes; equal mmsi, at most `within` s apart."""
    left = [{k: r[k] for k in ("mmsi", "shipname", "lat", "lon", "ts")} for r in ais
            if inside(r["lat"], r["lon"], BOUNDS)]
    right = [{k: r[k] for k in ("mmsi", "next_leg", "free_load", "eta", "ts")} for r in routes
             if r["next_leg"] != "naval-base" and r["next_leg"] == "Los Angeles"
             and r["free_load"] >= 10]
    out = []
    for a in left:
        for b in right:
            if a["mmsi"] == b["mmsi"] and abs(epoch(a["ts"]) - epoch(b["ts"])) <= within:
                row = {**{f"ais.{k}": v for k, v in a.items()},
                       **{f"routes.{k}": v for k, v in b.items()}}
                out.append(tuple(sorted(row.items())))
    return sorted(out)


@pytest.mark.timeout(150)
def test_row_3_routes_only_through_the_join_equal_to_a_brute_force_join(table2):
    base = table2
    routes_schema = next(s for s in json.loads((POLICY.parents[1] / "streams.json").read_text())
                         if s["name"] == "routes")
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": "routes", "time_attribute": "ts", "source": {"kind": "ingest"},
        "schema": routes_schema["schema"]})
    assert r.status_code in (201, 409), r.text
    r = requests.post(f"{base}/policies", data=ROUTES_POLICY.read_bytes(), timeout=30,
                      headers=auth("nea", **{"Content-Type": XML}))
    assert r.status_code == 201, r.text
    try:
        # routes alone: refused, even claiming to be a join's side
        alone = request_body("read").replace(b">ais<", b">routes<")
        claimed = alone.replace(b"</Attributes>\n      <Attributes Category=\"urn:oasis:names:"
                                b"tc:xacml:3.0:attribute-category:action\">",
                                b'<Attribute AttributeId="urn:xsg:resource:join-with" '
                                b'IncludeInResult="false"><AttributeValue DataType="'
                                + S.encode() + b'">ais</AttributeValue></Attribute></Attributes>'
                                b'\n      <Attributes Category="urn:oasis:names:tc:xacml:3.0:'
                                b'attribute-category:action">', 1)
        assert b"join-with" in claimed
        for body in (alone, claimed):
            r = requests.post(f"{base}/requests", data=body, timeout=30,
                              headers=auth("mpa", **{"Content-Type": XML}))
            assert r.status_code == 403, r.text
        # the join: granted, with the grant's condition in its plan
        r = requests.post(f"{base}/requests", data=JOIN_REQUEST.read_bytes(), timeout=60,
                          headers=auth("mpa", **{"Content-Type": XML}))
        assert r.status_code == 201, r.text
        doc = r.json()
        assert doc["plan"]["streams"] == ["ais", "routes"] and doc["plan"]["join"]["within"] == 60
        assert "routes.consignee" not in doc["plan"]["output"]
        assert "WITHIN_POLYGON" in doc["sql"]
        reader = Reader(doc["handle"], "mpa").start()
        ais, routes = [], []
        for k in range(15, 27, 3):  # both streams in event-time order, chunk by chunk
            chunk = make_records(k, 3)
            ais += chunk
            routes += route_reports(chunk)
            ingest(base, chunk)
            r = requests.post(f"{base}/streams/routes/records", timeout=30,
                              data="".join(json.dumps(x) + "\n" for x in route_reports(chunk)),
                              headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
            assert r.status_code == 201, r.text
            time.sleep(0.4)
        want = expected_join(ais, routes, 60)
        assert 5 <= len(want) < len(routes)
        got = reader.wait_rows(len(want), timeout=90)
        time.sleep(1.0)
        got = sorted(tuple(sorted(row.items())) for row in reader.rows)
        assert got == want
        assert requests.delete(doc["handle"], headers=auth("mpa"), timeout=30).status_code \
            in (200, 204)
    finally:
        requests.delete(f"{base}/policies/urn:xsg:example:joins:routes-policy",
                        headers=auth("nea"), timeout=30)


# -- masks: the other ships' traffic, generalised ---------------------------------------------

def grid(value: float, step: str = "0.1") -> float:
    """Rounded down to the grid: exact decimal arithmetic on the value as written."""
    s = Decimal(step)
    return float((Decimal(repr(value)) / s).to_integral_value(rounding=ROUND_FLOOR) * s)


def traffic_view(records: list[dict], key: bytes) -> list[dict]:
    """The brute force of the read-traffic rule: ships outside the port waters,
    their position on the 0.1 degree grid, an HMAC-SHA-256 of the MMSI with the owner's key,
    the speed's band (0, 5, 10, 15, 20), the minute."""
    out = []
    for r in records:
        if inside(r["lat"], r["lon"], BOUNDS):
            continue
        t = datetime.fromisoformat(r["ts"].replace("Z", "+00:00"))
        out.append({"mmsi": hmac.new(key, str(r["mmsi"]).encode(), hashlib.sha256).hexdigest(),
                    "shiptype": r["shiptype"], "lat": grid(r["lat"]), "lon": grid(r["lon"]),
                    "speed": float(max(e for e in (0, 5, 10, 15, 20) if e <= r["speed"])),
                    "ts": t.replace(second=0, microsecond=0).strftime(
                        "%Y-%m-%dT%H:%M:%S.%fZ")})
    return out


@pytest.mark.timeout(90)
def test_the_port_authority_sees_other_ships_on_a_grid(table2, gateway):
    base = table2
    r = ask(base, "mpa-traffic", "read-traffic")
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["plan"]["masks"] == {"mmsi": "hash", "lat": "grid:0.1", "lon": "grid:0.1",
                                    "speed": "bands:0,5,10,15,20", "ts": "truncate:minute"}
    assert "floor(`lat` / 0.1) * 0.1 AS `lat`" in doc["sql"]
    reader = Reader(doc["handle"], "mpa-traffic").start()
    records = make_records(30, 10)
    assert near_a_boundary(records) == []
    ingest(base, records)
    count = len(traffic_view(records, b""))
    assert 0 < count < len(records)  # some ships are in the port waters, most are not
    assert wait_for(lambda: len(reader.rows) >= count, 60), (len(reader.rows), count)
    time.sleep(0.5)
    key = gateway.runtime.mask_keys.path_for("nea").read_bytes()  # made at its first use
    want = traffic_view(records, key)
    assert len({(w["lat"], w["lon"]) for w in want}) < len(want)  # ships share grid cells
    assert reader.rows == want
    assert key.hex() not in json.dumps(doc)
    assert requests.delete(doc["handle"], headers=auth("mpa-traffic"),
                           timeout=30).status_code in (200, 204)
    # a finer grid is refused; a coarser one is granted, and a filter reads its cells
    r = ask(base, "mpa-traffic", "read-traffic", {"mask": {"lat,lon": "grid:0.01"}})
    assert r.status_code == 403 and "lat" in error(r), r.text
    r = ask(base, "mpa-traffic", "read-traffic",
            {"mask": {"lat,lon": "grid:0.5"}, "filter": "lat = 1.0 AND lon >= 104"})
    assert r.status_code == 201, r.text
    assert "floor(`lat` / 0.5) * 0.5 = 1" in r.json()["sql"], r.json()["sql"]
    assert requests.delete(r.json()["handle"], headers=auth("mpa-traffic"),
                           timeout=30).status_code in (200, 204)
