"""POST /streams (registration JSON): any body and Content-Type -> below 500."""
from __future__ import annotations

from hypothesis import given, strategies as st

from tests.fuzz.support import (
    FUZZ_MORE,
    ODD_BODIES,
    Raw,
    check,
    content_type,
    dump,
    headers,
    hostile_slot,
    json_scalar,
    mostly,
    mutated,
    nasty_text,
    number_token,
    one_of,
    to_bytes,
)
from tests.pep.conftest import auth_header

field_types = mostly(st.sampled_from(["double", "long", "string", "boolean", "timestamp"]),
                     one_of(st.sampled_from(["DOUBLE", "int"]), json_scalar))
field = mostly(st.fixed_dictionaries({"name": mostly(st.from_regex(
    r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True), one_of(nasty_text(6), json_scalar)),
    "type": field_types}), json_scalar)
option_value = one_of(number_token.map(Raw), nasty_text(8), json_scalar,
                      st.sampled_from(["/tmp", "weather", "ais", "127.0.0.1", "65536"]))
SOURCES = ({"kind": "ingest"}, {"kind": "generator", "schema": "weather", "rate": 5},
           {"kind": "files", "path": "/tmp", "format": "json"},
           {"kind": "socket", "host": "127.0.0.1", "port": 9999},
           {"kind": "kafka", "bootstrap.servers": "k:9092", "subscribe": "t"})


@st.composite
def registrations(draw) -> bytes:
    """A valid registration but for at most one hostile value."""
    bad = hostile_slot(draw, ("name", "schema", "field", "source", "option", "option",
                              "time_attribute", "extra", "nesting"))
    name = draw(st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,10}", fullmatch=True))
    doc: dict = {"name": draw(one_of(nasty_text(6), json_scalar)) if bad == "name" else name}
    schema = [{"name": "samplingtime", "type": "timestamp"}, {"name": "v", "type": "double"}]
    if bad == "schema":
        doc["schema"] = draw(one_of(st.lists(field, min_size=1, max_size=4), json_scalar))
    elif bad == "field":
        schema.insert(draw(st.integers(0, 2)), draw(field))
        doc["schema"] = schema
    else:
        doc["schema"] = schema
    source = dict(draw(st.sampled_from(SOURCES)))
    if source["kind"] == "generator":
        doc.pop("schema")
    if bad == "option":
        source[draw(st.sampled_from(["path", "format", "schema", "rate", "host", "port",
                                     "bootstrap.servers", "subscribe", "maxFilesPerTrigger",
                                     "\ud800"]))] = draw(option_value)
    doc["source"] = draw(one_of(json_scalar, st.fixed_dictionaries(
        {"kind": json_scalar}))) if bad == "source" else source
    if bad == "time_attribute":
        doc["time_attribute"] = draw(one_of(st.sampled_from(["v", "V", "nosuch"]), json_scalar))
    elif source["kind"] != "generator":
        doc["time_attribute"] = "samplingtime"
    if bad == "extra":
        doc[draw(nasty_text(4))] = draw(json_scalar)
    if bad == "nesting":
        depth = draw(st.sampled_from([20, 200, 2000, 50_000]))
        doc[draw(st.sampled_from(["schema", "source", "name"]))] = Raw(
            draw(st.sampled_from(["[", '{"a":'])) * depth + "1"
            + draw(st.sampled_from(["]", "}"])) * depth)
    return to_bytes(dump(doc))


bodies = mostly(st.tuples(registrations(), st.sampled_from(
    ["application/json", "application/json; charset=utf-8"])), one_of(
    st.tuples(registrations(), content_type("json")),
    st.tuples(registrations().flatmap(mutated), content_type("json")),
    st.tuples(st.sampled_from(ODD_BODIES), content_type()),
))


@FUZZ_MORE
@given(body=bodies, who=st.sampled_from(["nea", "nea", "nea", "lta"]))
def test_register_stream_answers_below_500(gateway, body, who):
    data, ctype = body
    r = gateway.client.post("/streams", data=data, headers=headers(auth_header(who), ctype))
    check(r, what=f"POST /streams {ctype!r}")
    if r.status_code == 201:
        name = r.get_json()["name"]
        check(gateway.client.get(f"/streams/{name}", headers=auth_header("lta")),
              what="GET /streams/<name>")
        listed = gateway.client.get("/streams", headers=auth_header("lta"))
        check(listed, what="GET /streams")


patches = one_of(
    st.fixed_dictionaries({"visibility": one_of(st.sampled_from(["listed", "restricted"]),
                                                nasty_text(8), json_scalar)}),
    st.dictionaries(one_of(st.sampled_from(["visibility", "owner", "schema", "name"]),
                           nasty_text(4)), json_scalar, max_size=3),
    json_scalar)
patch_bodies = mostly(st.tuples(patches.map(lambda doc: to_bytes(dump(doc))),
                                st.just("application/json")),
                      one_of(st.tuples(patches.map(lambda d: to_bytes(dump(d))).flatmap(mutated),
                                       content_type("json")),
                             st.tuples(st.sampled_from(ODD_BODIES), content_type())))


@FUZZ_MORE
@given(body=patch_bodies, who=st.sampled_from(["nea", "nea", "lta"]),
       name=mostly(st.sampled_from(["ships", "SHIPS", "nosuch"]), nasty_text(6)))
def test_change_stream_answers_below_500(gateway, body, who, name):
    """PATCH /streams/<name> (visibility): any body, Content-Type and name -> below 500; after
    it, the stream is listed again (other fuzz tests use it)."""
    data, ctype = body
    name = "".join(c for c in name.encode("utf-8", "ignore").decode() if c not in "/?#%\x00")
    path = "/streams/" + (name or "x")
    r = gateway.client.patch(path, data=data, headers=headers(auth_header(who), ctype))
    check(r, what=f"PATCH {path} {ctype!r}")
    check(gateway.client.get("/streams", headers=auth_header("lta")), what="GET /streams")
    gateway.services.catalog.update("ships", {"visibility": "listed"}, by="nea")
