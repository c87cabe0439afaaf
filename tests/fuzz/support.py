"""What the endpoint fuzz tests share: the settings, the nasty inputs, and the one check.

The check is the issue's rule (issue 9, item 4): whatever a client sends, the gateway answers
below 500, and a refusal (>= 400) has a body that says what went wrong: the JSON error body of
`common.http.errors` with a non-empty `error`, or, where the gateway answers in XACML (POST /pdp,
a denial or a request that does not parse), a XACML response with a decision and, for a 400, a
status message.

Strategies mix valid documents with mutations: unicode edge cases (lone surrogates as JSON
escapes, as XML character references and as raw CESU-8 bytes; NUL; RTL marks; BOMs;
non-characters; very long text), numbers at the limits of their types written as raw JSON or XML
tokens (1e300, 1e309, -0.0, NaN, Infinity, 2**63, 2**64, 400-digit and 5000-digit integers),
deep nesting, odd or missing Content-Types, and byte-level damage.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings, strategies as st
from lxml import etree

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies" / "weather"
NEA_POLICY = (POLICIES / "nea-weather-policy.xml").read_bytes()
NEA_POLICY_ID = "urn:xsg:example:weather:nea-policy"
LTA_REQUEST_XML = (POLICIES / "lta-request.xml").read_bytes()
LTA_REQUEST_JSON = (POLICIES / "lta-request.json").read_bytes()

# Reproducible in CI: a fixed derandomised search and no example database between runs.
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much,
                                       HealthCheck.large_base_example])
# For the endpoints where an example costs little and the odd inputs that reach deep are rarer
# (about one example in fifty in the ones found so far): twice the examples, still seconds.
FUZZ_MORE = settings(FUZZ, max_examples=300)

WEATHER = {"name": "weather", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
           "schema": [{"name": n, "type": t} for n, t in (
               ("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
               ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
               ("winddirection", "long"), ("barometer", "double"))]}
# A stream with every field type (strings and booleans are what the weather stream lacks),
# with the same obligations as NEA's weather policy so that LTA is permitted on it too.
SHIPS = {"name": "ships", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
         "schema": [{"name": n, "type": t} for n, t in (
             ("samplingtime", "timestamp"), ("rainrate", "double"), ("windspeed", "double"),
             ("winddirection", "long"), ("shipname", "string"), ("moored", "boolean"))]}
SHIPS_POLICY_ID = "urn:xsg:fuzz:ships-policy"
SHIPS_POLICY = (NEA_POLICY.replace(b">weather<", b">ships<")
                .replace(NEA_POLICY_ID.encode(), SHIPS_POLICY_ID.encode()))
STREAMS = ("weather", "ships")
ATTRIBUTES = ("samplingtime", "temperature", "rainrate", "windspeed", "winddirection",
              "shipname", "moored", "RainRate", "SAMPLINGTIME", "nosuch", "_xsg_seq")


# -- choosing: evenly, so that the rare branches (where the edge cases are) are drawn too -------

def one_of(*strategies: st.SearchStrategy) -> st.SearchStrategy:
    """Each branch equally often. (st.one_of favours its first branches, the simplest ones,
    which starved the rare branches that hold the edge cases.)"""
    return st.sampled_from(range(len(strategies))).flatmap(lambda i: strategies[i])


def one_in(draw, n: int) -> bool:
    """True once in `n` draws (st.integers and st.booleans lean to their simplest value)."""
    return draw(st.sampled_from(range(n))) == 0


def mostly(good: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`good` five times in six: deep paths are reached only by inputs that pass the first
    checks, so the mutations are mixed into mostly valid documents."""
    return st.sampled_from((True,) * 5 + (False,)).flatmap(lambda ok: good if ok else odd)


# -- nasty text -----------------------------------------------------------------------------------

NASTY_CHARS = (
    "\ud800", "\udbff", "\udc00", "\udfff",          # lone surrogates
    "\x00", "\x01", "\x1b", "\x7f", "\x85",           # NUL and other controls
    "\u200f", "\u202e", "\u2066", "\u061c",           # RTL marks, overrides, isolates
    "\ufeff", "\ufffe", "\uffff", "\U0010ffff",       # BOM and non-characters
    "\U0001f600", "\u0301", "\u2028", "\u00a0",       # astral, combining, separators
    "İ", "ß", "ﬃ", "ſ", "K",                          # case mapping changes the length
    "'", '"', "\\", "`", "\n", "\r", "\t", " ",
    "<", ">", "&", "]]>", "{", "}", "%", ":", ";", "/", "=", "(", ")",
)
LONG_TEXT = ("a" * 70_000, "\ud800" * 3_000, "é" * 40_000, "'" * 20_000, "(" * 5_000)
LONE_SURROGATES = ("\ud800", "x\udfff", "\udc00\ud800", "a\udbffb", "\ud83d", "\ude00 ")


def nasty_text(max_size: int = 12) -> st.SearchStrategy[str]:
    """Any text, nasty characters, long runs, or lone surrogates (a fifth of the time each)."""
    return one_of(
        st.text(max_size=max_size),
        st.lists(st.sampled_from(NASTY_CHARS), max_size=max_size).map("".join),
        st.lists(one_of(st.sampled_from(NASTY_CHARS), st.characters()),
                 max_size=max_size).map("".join),
        st.sampled_from(LONG_TEXT),
        st.sampled_from(LONE_SURROGATES),
    )


# -- numbers at the limits, as raw tokens (they may not be valid JSON: that is the point) --------

EDGE_NUMBERS = (
    "1e300", "-1e300", "1e308", "1.7976931348623157e308", "1e309", "-1e309", "1e-400", "5e-324",
    "-0.0", "-0", "NaN", "Infinity", "-Infinity",
    str(2 ** 63 - 1), str(2 ** 63), str(-(2 ** 63)), str(-(2 ** 63) - 1), str(2 ** 64),
    str(-(2 ** 64)), str(2 ** 53 + 1), "1" + "0" * 400, "9" * 5000,
    "253402300799", "253402300800", "-62135596800", "-62135596801", "1e11", "-1e11", "1e20",
    "123456789012345678901234567890.5",
)
ORDINARY_NUMBERS = ("0", "0.0", "1", "5", "1.5", "-1", "0.1", "1e15", "1e16", "1E2", "1e+2",
                    "1700000000")
BAD_NUMBERS = ("nan", "inf", "INF", "00", "01", "+1", ".5", "5.", "1e", "0x10")  # not JSON
NUMBER_TOKENS = EDGE_NUMBERS + ORDINARY_NUMBERS + BAD_NUMBERS
number_token = st.sampled_from((0,) * 5 + (1,) * 4 + (2,)).flatmap(
    lambda i: st.sampled_from((EDGE_NUMBERS, ORDINARY_NUMBERS, BAD_NUMBERS)[i]))
TIMESTAMP_TEXTS = (
    "2024-01-01T00:00:00Z", "2024-01-01", "9999-12-31T23:59:59.999999Z",
    "0001-01-01T00:00:00", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
    "10000-01-01T00:00:00", "2024-13-01", "2024-02-30", "2024-01-01T25:00:00",
    "2024-01-01T00:00:00+24:00", "  2024-01-01  ", "2024-01-01T00:00:00.1234567Z", "",
)


@dataclass(frozen=True)
class Raw:
    """A JSON token written as is (NaN, 1e309, a 5000-digit integer ...)."""

    token: str


def dump(value: Any) -> str:
    """JSON text of a value that may hold Raw tokens; strings keep lone surrogates as escapes."""
    if isinstance(value, Raw):
        return value.token
    if isinstance(value, dict):
        return "{" + ",".join(f"{dump(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)  # ensure_ascii: "\ud800" becomes the escape \ud800


def to_bytes(text: str) -> bytes:
    """UTF-8, except lone surrogates, which become their (invalid) CESU-8 bytes."""
    return text.encode("utf-8", "surrogatepass")


def xml_escape(text: str, charrefs: bool) -> str:
    """Escape markup; with `charrefs`, characters XML cannot carry become &#x..; references
    (which a conforming parser must refuse), else they are left raw."""
    out = []
    for ch in text:
        if ch == "&":
            out.append("&amp;")
        elif ch == "<":
            out.append("&lt;")
        elif ch == ">":
            out.append("&gt;")
        elif ch == '"':
            out.append("&quot;")
        elif charrefs and (ord(ch) < 0x20 or 0xD800 <= ord(ch) <= 0xDFFF or ord(ch) >= 0xFFFE):
            out.append(f"&#x{ord(ch):X};")
        else:
            out.append(ch)
    return "".join(out)


# -- conditions (the stream-filter and user-query language) ---------------------------------------

OPERATORS = ("<", ">", "<=", ">=", "=", "==", "!=", "<>", "≤", "≥", "≠", "=>", "!", "")


@st.composite
def string_literal(draw) -> str:
    text = draw(nasty_text(8))
    quote = draw(st.sampled_from("'\""))
    body = text.replace("\\", "\\\\").replace(quote, "\\" + quote)
    escapes = draw(st.lists(st.sampled_from(
        ["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\u0000", "\\uffff", "\\u12", "\\x41", "\\n",
         "\\0", "\\", "\\u00e9", "\\udc00\\ud800"]), max_size=2))
    return quote + body + "".join(escapes) + draw(st.sampled_from([quote, quote, ""]))


literal = one_of(
    number_token,
    string_literal(),
    st.sampled_from(TIMESTAMP_TEXTS).map(lambda t: f"'{t}'"),
    st.sampled_from(["true", "FALSE", "{subject:clearance}", "{resource:resource-id}",
                     "{subject:subject-id}", "{nosuch:x}", "{subject:\ud800}", "{", "{}",
                     "null", "NaN", "Infinity"]),
)


FIELD_TYPES = {"samplingtime": "timestamp", "rainrate": "double", "windspeed": "double",
               "winddirection": "long", "shipname": "string", "moored": "boolean"}
# the edges of a timestamp: years 1 and 9999 in epoch seconds and in text, and far beyond
TIMESTAMP_EDGES = ("1e300", "-1e300", "1e20", "253402300799", "253402300800", "-62135596800",
                   "-62135596801", "1700000000", "0", "-0.0", str(2 ** 63 - 1), "1" + "0" * 400)
TYPED_LITERALS = {
    "timestamp": one_of(st.sampled_from(TIMESTAMP_EDGES), number_token,
                        st.sampled_from(TIMESTAMP_TEXTS).map(lambda t: f"'{t}'")),
    "double": number_token, "long": number_token,
    "string": st.deferred(lambda: string_literal()),
    "boolean": st.sampled_from(["true", "false", "TRUE", "1", "'true'"]),
}


@st.composite
def typed_comparison(draw) -> str:
    """An attribute of the fuzz streams compared with a literal of (about) its type; the event
    time and the string more often than the others, their edges being the furthest."""
    attr = draw(st.sampled_from(sorted(FIELD_TYPES) + ["samplingtime"] * 2 + ["shipname"]))
    op = draw(st.sampled_from(OPERATORS[:11]))
    value = draw(TYPED_LITERALS[FIELD_TYPES[attr]])
    return f"{attr} {op} {value}" if one_in(draw, 2) else f"{value} {op} {attr}"


@st.composite
def wild_comparison(draw) -> str:
    attr = draw(one_of(st.sampled_from(ATTRIBUTES), nasty_text(4)))
    op = draw(st.sampled_from(OPERATORS))
    value = draw(literal)
    if one_in(draw, 2):
        return f"{attr} {op} {value}"
    return f"{value} {op} {attr}"


comparison = mostly(typed_comparison(), wild_comparison())


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return one_of(
        st.tuples(children, st.sampled_from([" AND ", " OR ", " and ", " && ", " "]),
                  children).map("".join),
        children.map(lambda c: f"NOT {c}"),
        children.map(lambda c: f"({c})"),
    )


conditions = mostly(st.recursive(comparison, _combine, max_leaves=4), one_of(
    st.integers(60, 80).map(lambda n: "(" * n + "rainrate > 1" + ")" * n),
    st.integers(60, 80).map(lambda n: "NOT " * n + "rainrate > 1"),
    st.just(" OR ".join(f"rainrate > {i}" for i in range(3000))),
    st.just("rainrate > 1 " + "AND " * 5000 + "rainrate > 2"),
    st.just(" AND ".join(f"(rainrate > {i} OR windspeed < {i})" for i in range(40))),
    nasty_text(30),
))


# -- user queries (JSON and XML forms) ------------------------------------------------------------

json_scalar = one_of(number_token.map(Raw), nasty_text(6), st.booleans(), st.none())


# masks a consumer may ask for (pep.core.masks): some fit their attribute, some do not
MASK_SPECS = ("round:10", "round:0.5", "grid:1", "truncate:hour", "bands:0,5,50", "prefix:2",
              "suffix:1", "hash", "null", "round:0", "blur", "bands:5,1", "prefix:-1")
mask_text = one_of(st.tuples(st.sampled_from(sorted(FIELD_TYPES)), st.sampled_from(MASK_SPECS))
                   .map(lambda p: f"{p[0]}:{p[1]}"), nasty_text(8))
AGGREGATES = ("rainrate:avg", "avg(rainrate)", "samplingtime:lastval", "windspeed:max",
              "shipname:max", "moored:min", "winddirection:sum", "rainrate:count")
ODD_AGGREGATES = ("moored:avg", "shipname:sum", "rainrate:", ":avg", "avg(", "x:y:z", "avg()")
window_number = mostly(st.sampled_from([1, 2, 5, 6, 10, 60, 3600, 10 ** 6]),
                       one_of(number_token.map(Raw), st.integers(-3, 2 ** 70)))
aggregate = mostly(st.sampled_from(AGGREGATES), one_of(
    st.sampled_from(ODD_AGGREGATES), nasty_text(6),
    st.fixed_dictionaries({"attribute": nasty_text(4), "function": nasty_text(4)}), json_scalar))
attribute_name = mostly(st.sampled_from(sorted(FIELD_TYPES)), one_of(
    st.sampled_from(ATTRIBUTES), nasty_text(4)))


def hostile_slot(draw, slots: tuple[str, ...]) -> str | None:
    """Which one part of a document gets a hostile value (None: none does). One at a time, so
    that the rest of the document passes the early checks and the value reaches the deep code."""
    return draw(st.sampled_from((None,) * 2 + slots))


@st.composite
def json_user_query(draw) -> Any:
    """A user query as a Python value (with Raw tokens): a filter of typed comparisons at the
    edges of their types, valid elsewhere except, maybe, in one hostile slot."""
    bad = hostile_slot(draw, ("stream", "filter", "map", "window", "window", "extra", "wrap",
                              "mask"))
    query: dict[str, Any] = {}
    if one_in(draw, 4) or bad == "mask":
        query["mask"] = draw(st.lists(mask_text, min_size=1, max_size=3) if bad != "mask"
                             else one_of(st.dictionaries(nasty_text(6), json_scalar, max_size=2),
                                         json_scalar, st.lists(json_scalar, max_size=2)))
    if bad == "stream":
        query["stream"] = draw(one_of(st.sampled_from(STREAMS), json_scalar))
    if not one_in(draw, 5) or bad == "filter":
        query["filter"] = draw(conditions if bad != "filter"
                               else one_of(conditions, json_scalar))
    if one_in(draw, 2) or bad == "map":
        query["map"] = draw(st.lists(st.sampled_from(sorted(FIELD_TYPES)), min_size=1, max_size=3)
                            if bad != "map" else one_of(
                                st.lists(attribute_name, max_size=4), json_scalar))
    if one_in(draw, 2) or bad == "window":
        good = bad != "window"
        window: dict[str, Any] = {
            "type": draw(st.sampled_from(["tuple", "time"]) if good else one_of(
                st.sampled_from(["TIME", " tuple ", "session"]), json_scalar)),
            "size": draw(st.sampled_from([5, 6, 10, 60]) if good else window_number),
            "step": draw(st.sampled_from([2, 4, 10]) if good else window_number),
        }
        if one_in(draw, 2):
            window["aggregates"] = draw(st.lists(st.sampled_from(AGGREGATES), max_size=3) if good
                                        else one_of(st.lists(aggregate, max_size=3),
                                                    json_scalar))
        if not good and one_in(draw, 4):
            window.pop(draw(st.sampled_from(["type", "size", "step"])))
        query["window"] = window if good else draw(mostly(st.just(window), json_scalar))
    if bad == "extra":
        query[draw(nasty_text(5))] = draw(json_scalar)
    if bad == "wrap":
        return draw(st.sampled_from([{"UserQuery": query}, [query], {"UserQuery": [query]}]))
    return query


@st.composite
def xml_user_query(draw) -> str:
    """A user query in the XML form, as text (not yet encoded); one hostile slot at most."""
    bad = hostile_slot(draw, ("stream", "filter", "map", "window", "window", "extra", "root",
                              "charrefs"))
    charrefs = bad == "charrefs"

    def esc(text: str) -> str:
        return xml_escape(text, charrefs)

    parts = []
    if one_in(draw, 4):
        masks = draw(st.lists(mask_text, max_size=2))
        parts.append("<Mask>" + "".join(f"<Attribute>{esc(m)}</Attribute>" for m in masks)
                     + "</Mask>")
    if bad == "stream":
        name = draw(one_of(st.sampled_from(STREAMS), nasty_text(6)))
        parts.append(f'<Stream name="{esc(name)}"/>')
    if not one_in(draw, 5) or bad in ("filter", "charrefs"):
        text = draw(conditions if bad != "filter" else one_of(conditions, nasty_text(20)))
        parts.append(f"<Filter><FilterCondition>{esc(text)}</FilterCondition></Filter>")
    if one_in(draw, 2) or bad == "map":
        attrs = draw(st.lists(st.sampled_from(sorted(FIELD_TYPES)), min_size=1, max_size=3)
                     if bad != "map" else st.lists(attribute_name, max_size=3))
        parts.append("<Map>" + "".join(f"<Attribute>{esc(a)}</Attribute>" for a in attrs)
                     + "</Map>")
    if one_in(draw, 2) or bad == "window":
        good = bad != "window"
        kind = draw(st.sampled_from(["tuple", "time"]) if good else nasty_text(4))
        size, step = (draw(st.sampled_from(values) if good else window_number)
                      for values in ([5, 6, 10, 60], [2, 4, 10]))
        size, step = (x.token if isinstance(x, Raw) else str(x) for x in (size, step))
        aggs = draw(st.lists(st.sampled_from(AGGREGATES) if good else
                             one_of(st.sampled_from(ODD_AGGREGATES), nasty_text(5)),
                             max_size=2))
        parts.append(f"<Aggregation><WindowType>{esc(kind)}</WindowType>"
                     f"<WindowSize>{esc(size)}</WindowSize><WindowStep>{esc(step)}</WindowStep>"
                     + "".join(f"<Attribute>{esc(a)}</Attribute>" for a in aggs)
                     + "</Aggregation>")
    if bad == "extra":
        parts.append(draw(st.sampled_from(["<Bogus/>", "<Filter/>", "<!-- c -->",
                                           "<?pi x?>", "<Map><Attribute><x/></Attribute></Map>",
                                           "<a>" * 40 + "</a>" * 40])))
    root = "UserQuery" if bad != "root" else draw(st.sampled_from(["Query", "x:UserQuery"]))
    return f'<{root} xmlns="">' + "".join(parts) + f"</{root}>"


# -- XACML requests -------------------------------------------------------------------------------

XS = "http://www.w3.org/2001/XMLSchema#"
DATATYPES = ("string", "integer", "double", "boolean", "dateTime", "date", "time",
             "dayTimeDuration", "yearMonthDuration", "anyURI", "hexBinary", "base64Binary",
             "urn:oasis:names:tc:xacml:1.0:data-type:rfc822Name",
             "urn:oasis:names:tc:xacml:1.0:data-type:x500Name",
             "urn:oasis:names:tc:xacml:2.0:data-type:ipAddress",
             "urn:oasis:names:tc:xacml:2.0:data-type:dnsName", "urn:x:unknown")
SUBJECT_CAT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RESOURCE_CAT = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ACTION_CAT = "urn:oasis:names:tc:xacml:3.0:attribute-category:action"
ENV_CAT = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"

extra_value = one_of(number_token, nasty_text(8), st.sampled_from(TIMESTAMP_TEXTS),
                     st.sampled_from(["true", "P1D", "-P999999999999Y", "P1Y2M", "PT1e300S",
                                      "00zz", "====", "1.2.3.4/99", "::ffff:1.2.3.4",
                                      "a@b", "cn=x", "http://x/%zz"]))


@st.composite
def xacml_xml_request(draw, with_query: bool = True) -> bytes:
    """A XACML XML request for a stream (the user query, if any, in the resource Content);
    one hostile slot at most: the stream, an extra attribute, a flag, the encoding, charrefs."""
    bad = hostile_slot(draw, ("stream", "extra", "extra", "flags", "encoding", "charrefs")
                       + (("query",) * 3 if with_query else ()))
    charrefs = bad == "charrefs"

    def esc(text: str) -> str:
        return xml_escape(text, charrefs)

    stream = draw(st.sampled_from(STREAMS) if bad not in ("stream", "charrefs")
                  else nasty_text(6))
    action = draw(st.sampled_from(["read", "subscribe"]))
    extra = ""
    if bad == "extra":
        dt = draw(st.sampled_from(DATATYPES))
        dt = dt if ":" in dt else XS + dt
        cat = draw(st.sampled_from([SUBJECT_CAT, RESOURCE_CAT, ACTION_CAT, ENV_CAT]))
        attr_id = draw(mostly(st.sampled_from(["urn:x:a", "clearance"]), nasty_text(6)))
        include = draw(mostly(st.sampled_from(["true", "false"]), st.sampled_from(["1", "x"])))
        extra = (f'<Attributes Category="{cat}"><Attribute AttributeId="{esc(attr_id)}"'
                 f' IncludeInResult="{include}">'
                 f'<AttributeValue DataType="{esc(dt)}">{esc(draw(extra_value))}</AttributeValue>'
                 "</Attribute></Attributes>")
    content = ""
    if with_query and (bad == "query" or one_in(draw, 2)):
        content = f"<Content>{draw(xml_user_query())}</Content>"
    flag = draw(st.sampled_from(["2", "yes", ""])) if bad == "flags" else "false"
    doc = (f'<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" '
           f'ReturnPolicyIdList="{flag}" CombinedDecision="false">'
           f'<Attributes Category="{SUBJECT_CAT}"><Attribute AttributeId='
           f'"urn:oasis:names:tc:xacml:1.0:subject:subject-id" IncludeInResult="false">'
           f'<AttributeValue DataType="{XS}string">lta</AttributeValue></Attribute></Attributes>'
           f'<Attributes Category="{RESOURCE_CAT}">{content}<Attribute AttributeId="{RESOURCE_ID}"'
           f' IncludeInResult="false"><AttributeValue DataType="{XS}string">{esc(stream)}'
           f"</AttributeValue></Attribute></Attributes>"
           f'<Attributes Category="{ACTION_CAT}"><Attribute AttributeId='
           f'"urn:oasis:names:tc:xacml:1.0:action:action-id" IncludeInResult="false">'
           f'<AttributeValue DataType="{XS}string">{action}</AttributeValue></Attribute>'
           f"</Attributes>{extra}</Request>")
    if bad == "encoding":
        encoding = draw(st.sampled_from(["UTF-8", "UTF-16", "ISO-8859-1", "nosuch", "ascii"]))
        doc = f'<?xml version="1.0" encoding="{encoding}"?>' + doc
    return to_bytes(doc)


@st.composite
def xacml_json_request(draw, with_query: bool = True) -> bytes:
    """A XACML JSON Profile request for a stream (the user query, if any, in the resource
    Content as an object, as JSON text or as XML text); one hostile slot at most."""
    bad = hostile_slot(draw, ("stream", "extra", "extra", "member", "member", "flags")
                       + (("query",) * 3 if with_query else ()))
    stream = draw(st.sampled_from(STREAMS) if bad != "stream"
                  else one_of(nasty_text(6), json_scalar))
    resource: dict[str, Any] = {"Attribute": [{"AttributeId": RESOURCE_ID, "Value": stream}]}
    if with_query and (bad == "query" or one_in(draw, 2)):
        form = draw(st.sampled_from(["object", "object", "text", "xml"]))
        if form == "object":
            resource["Content"] = draw(json_user_query())
        elif form == "text":
            resource["Content"] = dump(draw(json_user_query()))
        else:
            resource["Content"] = draw(xml_user_query())
    request: dict[str, Any] = {
        "AccessSubject": {"Attribute": [{"AttributeId":
                                         "urn:oasis:names:tc:xacml:1.0:subject:subject-id",
                                         "Value": "lta"}]},
        "Resource": resource,
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": draw(st.sampled_from(["read", "subscribe"]))}]},
    }
    if bad == "extra":
        attr: dict[str, Any] = {"AttributeId": draw(mostly(st.sampled_from(
                                    ["urn:x:a", "clearance", "urn:x:b"]), nasty_text(6))),
                                "Value": draw(one_of(json_scalar,
                                                     st.lists(json_scalar, max_size=3)))}
        if one_in(draw, 2):
            attr["DataType"] = draw(one_of(st.sampled_from(DATATYPES), json_scalar))
        if one_in(draw, 5):
            attr["Issuer"] = draw(json_scalar)
        if one_in(draw, 5):
            attr["IncludeInResult"] = draw(json_scalar)
        key = draw(st.sampled_from(["Environment", "Resource", "AccessSubject", "Category"]))
        if key == "Category":
            request["Category"] = [{"CategoryId": draw(one_of(
                st.sampled_from(["urn:x:cat", ENV_CAT]), json_scalar)), "Attribute": [attr]}]
        else:
            request.setdefault(key, {"Attribute": []})["Attribute"].append(attr)
    if bad == "flags":
        request[draw(st.sampled_from(["ReturnPolicyIdList", "CombinedDecision"]))] = \
            draw(json_scalar)
    if bad == "member":  # unknown members: their names end up in the messages
        target = draw(st.sampled_from([request] * 3 + [resource, resource["Attribute"][0]]))
        target[draw(one_of(nasty_text(4), st.sampled_from(LONE_SURROGATES)))] = draw(json_scalar)
    return to_bytes(dump({"Request": request}))


# -- byte-level damage and odd bodies -------------------------------------------------------------

ODD_BODIES = (b"", b" ", b"\n", b"null", b"[]", b"{}", b'"x"', b"0", b"NaN", b"\xff\xfe",
              b"\xef\xbb\xbf", b"\xef\xbb\xbf{}", b"\x00" * 10, b"[" * 5000 + b"]" * 5000,
              b"{\"a\":" * 3000 + b"1" + b"}" * 3000, b"<a>" * 3000 + b"</a>" * 3000,
              b"<?xml version='1.0'?>", b"<Request/>", b"\xed\xa0\x80", b"\x80\x81",
              "<Request>\ud800</Request>".encode("utf-16-le", "surrogatepass"),
              b"\xff\xfe<\x00R\x00",
              b'{"Request": ' + b'{"a": ' * 200 + b"1" + b"}" * 201)


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """`seed` with a few bytes changed, deleted or spliced."""
    out = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        pos = draw(st.integers(0, len(out) - 1))
        op = draw(st.integers(0, 3))
        if op == 0:
            out[pos] = draw(st.sampled_from(b'<>/="&;x9 -\x00\xff\\{}[],:\'\x80'))
        elif op == 1:
            del out[pos:pos + draw(st.integers(1, 20))]
        elif op == 2:
            start = draw(st.integers(0, len(seed) - 1))
            out[pos:pos] = seed[start:start + draw(st.integers(1, 40))]
        else:
            out[pos:pos] = to_bytes(draw(st.sampled_from(NASTY_CHARS + EDGE_NUMBERS[:20])))
    return bytes(out)


XML_TYPES = ("application/xacml+xml", "application/xml", "text/xml")
JSON_TYPES = ("application/xacml+json", "application/json")
ODD_TYPES = (
    None, "", "text/plain", "application/octet-stream", "*/*", "application/", "/", ";",
    "application/x-www-form-urlencoded", "multipart/form-data", "multipart/form-data; boundary=",
    "multipart/form-data; boundary=xyz", "application/xacml+xml; charset=utf-16",
    "application/xacml+json; charset=latin-1", "application/xacml+json; charset=\"utf-8\"",
    "application/xacml+xml;;;", "APPLICATION/XACML+JSON", " application/json ",
    "application/json; charset=nosuch", "application/vnd.x+json", "image/svg+xml",
    "application/x-ndjson", "application/jsonl", "text/plain; charset=utf-8",
    "application/json; a=\"\\\"\"", "application/json; charset=\xff", "x" * 3000,
)


def content_type(kind: str | None = None) -> st.SearchStrategy[str | None]:
    right = XML_TYPES if kind == "xml" else JSON_TYPES if kind == "json" else XML_TYPES + JSON_TYPES
    return mostly(one_of(st.sampled_from(right),
                         st.sampled_from(right).map(lambda t: t + "; charset=utf-8")),
                  st.sampled_from(ODD_TYPES))


def headers(token_header: dict, ctype: str | None, **extra) -> dict:
    out = dict(token_header)
    if ctype is not None:
        out["Content-Type"] = ctype
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


# -- the check ------------------------------------------------------------------------------------

def _xacml_message(response) -> tuple[str, str] | None:
    """(decision, status message) of a XACML response body; None when it is not one."""
    if response.mimetype.endswith("json"):
        doc = response.get_json(silent=True)
        if not (isinstance(doc, dict) and isinstance(doc.get("Response"), list)):
            return None
        result = doc["Response"][0]
        return result.get("Decision", ""), (result.get("Status") or {}).get("StatusMessage", "")
    if not response.mimetype.endswith("xml"):
        return None
    root = etree.fromstring(response.data)
    ns = {"x": "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"}
    if root.tag != f"{{{ns['x']}}}Response":
        return None
    decision = root.findtext("x:Result/x:Decision", namespaces=ns) or ""
    message = root.findtext("x:Result/x:Status/x:StatusMessage", namespaces=ns) or ""
    return decision, message


def check(response, *, xacml: bool = False, what: str = "") -> None:
    """No 5xx; a refusal says what went wrong (JSON error body, or XACML where allowed)."""
    body = response.get_data()
    assert response.status_code < 500, (
        f"{what}: {response.status_code} {body[:300]!r}; the gateway log (captured above) has "
        "the stack trace")
    if response.status_code < 400:
        return
    answer = _xacml_message(response) if xacml else None
    if answer is not None:
        decision, message = answer
        assert decision in ("Deny", "Indeterminate", "NotApplicable", "Permit"), (what, body[:300])
        if response.status_code == 400:
            assert message.strip(), f"{what}: 400 in XACML without a StatusMessage: {body[:300]!r}"
        return
    assert response.mimetype == "application/problem+json", (
        f"{what}: {response.status_code} answered as {response.mimetype!r}: {body[:300]!r}")
    doc = response.get_json()
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"].strip(), (
        what, body[:300])
    assert doc.get("status") == response.status_code, (what, body[:300])
