"""POST /streams/<name>/records (ingest, JSON lines): any batch -> below 500, a refusal names
the line and the field."""
from __future__ import annotations

from urllib.parse import quote

from hypothesis import given, strategies as st

from tests.fuzz.support import (
    FUZZ_MORE,
    ODD_BODIES,
    TIMESTAMP_EDGES,
    TIMESTAMP_TEXTS,
    Raw,
    check,
    dump,
    headers,
    json_scalar,
    mostly,
    mutated,
    nasty_text,
    number_token,
    one_in,
    one_of,
    to_bytes,
)
from tests.pep.conftest import auth_header

WEATHER_RECORD = {"samplingtime": "2024-01-01T00:00:00Z", "temperature": 25.5, "humidity": 80.0,
                  "solarradiation": 1.0, "rainrate": 7.5, "windspeed": 3.0, "winddirection": 90,
                  "barometer": 1010.0}
SHIPS_RECORD = {"samplingtime": 1700000000, "rainrate": 1.0, "windspeed": 2.0,
                "winddirection": 7, "shipname": "Nordic Star", "moored": False}
RECORD_TYPES = (None, "application/x-ndjson", "application/json", "application/jsonl",
                "text/plain", "application/x-ndjson; charset=utf-8",
                "application/x-ndjson; charset=utf-16", "text/csv", "application/xml",
                "multipart/form-data", "", "*/*")

value = one_of(number_token.map(Raw), st.sampled_from(TIMESTAMP_TEXTS), nasty_text(8),
               json_scalar, st.lists(json_scalar, max_size=2),
               st.dictionaries(st.text(max_size=2), json_scalar, max_size=2))
TYPED = {"samplingtime": one_of(st.sampled_from(TIMESTAMP_EDGES).map(Raw),
                                number_token.map(Raw), st.sampled_from(TIMESTAMP_TEXTS)),
         "winddirection": number_token.map(Raw), "shipname": nasty_text(8),
         "moored": st.sampled_from([Raw("true"), Raw("false"), Raw("1"), "true"])}


@st.composite
def record_line(draw, base: dict) -> str:
    """Mostly the base record with one field replaced by a value at the edge of its type; else
    several fields replaced by anything, a field missing or added, or not a record at all."""
    record: dict = dict(base)
    kind = draw(st.sampled_from(["valid"] + ["typed"] * 6 + ["wild"] * 2 + ["shape"]))
    if kind == "typed":
        # the event time and the string field twice as often: their edges go furthest
        key = draw(st.sampled_from(sorted(base) + ["samplingtime"] + ["shipname"] * (
            "shipname" in base)))
        record[key] = draw(TYPED.get(key, number_token.map(Raw)))
    elif kind == "wild":
        for key in draw(st.lists(st.sampled_from(sorted(base)), min_size=1, max_size=3,
                                 unique=True)):
            record[key] = draw(value)
    elif kind == "shape":
        what = draw(st.sampled_from(["missing", "extra", "text"]))
        if what == "missing":
            record.pop(draw(st.sampled_from(sorted(base))))
        elif what == "extra":
            record[draw(one_of(nasty_text(5), st.sampled_from(["RAINRATE", "_xsg_seq"])))] = \
                draw(value)
        else:
            return draw(st.sampled_from(["[]", "1", "null", "{", '{"a":1,"a":2}', "\ud800",
                                         '{"samplingtime": NaN}', "{}" * 3]))
    return dump(record)


@st.composite
def batches(draw) -> tuple[str, bytes]:
    """Valid lines around one line that is (mostly) valid but for one value at an edge."""
    stream = draw(st.sampled_from(["weather", "ships"]))
    base = WEATHER_RECORD if stream == "weather" else SHIPS_RECORD
    lines = ([dump(base)] * draw(st.integers(0, 2)) + [draw(record_line(base))]
             + [dump(base)] * draw(st.integers(0, 1)))
    if one_in(draw, 5):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["", "  ", "\r"])))
    sep = draw(st.sampled_from(["\n"] * 4 + ["\r\n", "\n\n", "\u2028", "\x85"]))
    return stream, to_bytes(sep.join(lines))


@FUZZ_MORE
@given(batch=mostly(batches(), one_of(
           batches().flatmap(lambda b: st.tuples(st.just(b[0]), mutated(b[1]))),
           st.tuples(st.sampled_from(["weather", "ships"]), st.sampled_from(ODD_BODIES)),
           st.tuples(nasty_text(6).map(lambda n: quote(to_bytes(n), safe="")), st.just(b"{}")))),
       ctype=mostly(st.sampled_from(RECORD_TYPES[:5]), st.sampled_from(RECORD_TYPES)),
       who=st.sampled_from(["nea", "nea", "nea", "lta"]))
def test_append_records_answers_below_500(gateway, batch, ctype, who):
    stream, data = batch
    r = gateway.client.post(f"/streams/{stream}/records", data=data,
                            headers=headers(auth_header(who), ctype))
    check(r, what=f"POST /streams/{stream[:40]}/records {ctype!r}")
    if r.status_code == 400:
        doc = r.get_json()
        if stream in ("weather", "ships") and "line" in doc:
            assert doc["error"].startswith(f"line {doc['line']}"), doc
