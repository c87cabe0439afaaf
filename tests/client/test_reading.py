"""The client's reading state machine and schema rules against the gateway's own pieces, without
a server: NDJSON as the gateway formats a handle buffer's events (`pep.handles.buffer`,
`pep.http.handles.ndjson_event`), plans as the gateway renders them (`pep.core.explain`), and
the output types the gateway's own join analysis gives them (`pep.core.outputs`)."""
from __future__ import annotations

import pytest

from pep.core.explain import plan_to_json
from pep.core.outputs import side_outputs
from pep.core.plan import Aggregate, ExecutionPlan, Field, JoinPlan, StreamSchema, WindowSpec
from pep.handles.buffer import HandleBuffer
from pep.http.handles import ndjson_event
from xsg_client import ConnectionLost, Disconnected, End, Gap, Notice, Row, Unreachable, XsgError
from xsg_client._core import HandleRef, ReadOptions, ReadState
from xsg_client.schema import HandleSchema, parse_timestamp, schema_from_plan

SCHEMA = HandleSchema.of([("ts", "timestamp"), ("n", "long")])


def state(**options) -> ReadState:
    return ReadState(HandleRef("http://gw/handles/" + "h" * 43, "h" * 43), SCHEMA, None,
                     ReadOptions(**options))


def wire(buffer: HandleBuffer, after: int | None) -> bytes:
    """What the gateway writes to an NDJSON reader that resumes after `after`."""
    return "".join(ndjson_event(e) for e in buffer.read(after, timeout=0)).encode()


def test_the_gateways_events_become_the_clients():
    buffer = HandleBuffer(max_rows=3)
    buffer.put([{"ts": "2024-01-01T00:00:00.000001Z", "n": 2 ** 63 - 1}])
    first = wire(buffer, None)
    buffer.notice("stalled", {"stream": "s", "state": "stalled", "detail": "input waits"})
    buffer.put([{"ts": None, "n": i} for i in range(4)])  # the oldest row and notice drop
    buffer.notice("resumed", {"stream": "s"})
    rest = wire(buffer, 1)
    buffer.close("revoked", "policy urn:p was deleted")  # (unread rows would be withheld)
    reader = state()
    got = reader.feed(first)
    assert got == [Row(1, {"ts": parse_timestamp("2024-01-01T00:00:00.000001Z"),
                           "n": 2 ** 63 - 1})]
    assert reader.last_event_id == 1
    events = [e for i in range(len(rest)) for e in reader.feed(rest[i:i + 1])]  # byte by byte
    kinds = [(type(e).__name__, e.id) for e in events]
    assert kinds == [("Gap", 3), ("Row", 4), ("Row", 5), ("Row", 6), ("Notice", 7)]
    gap = events[0]
    assert isinstance(gap, Gap) and gap.lost == 1 and gap.resume_from == 3
    assert events[-1] == Notice(7, "resumed", {"stream": "s"})
    assert reader.end is None
    final = reader.feed(wire(buffer, 7))
    assert final == [End(8, "revoked", "policy urn:p was deleted")] and reader.end == final[0]


def test_a_notice_a_reader_did_not_skip_and_a_shutdown():
    buffer = HandleBuffer()
    buffer.notice("stalled", {"stream": "s", "state": "failed", "detail": "boom"})
    text = wire(buffer, None) + b'{"event":"heartbeat"}\n'
    buffer.close("shutdown", "the gateway is stopping; reconnect after its restart")
    text += wire(buffer, 1)
    resuming = state()
    assert resuming.feed(text) == [Notice(1, "stalled", {"stream": "s", "state": "failed",
                                                         "detail": "boom"})]
    assert resuming.end is None and resuming.last_event_id == 2
    assert resuming.closed_cause() == ("shutdown: the gateway is stopping; reconnect after "
                                       "its restart")
    ending = state(resume_after_shutdown=False)
    assert ending.feed(text)[-1] == End(2, "shutdown", "the gateway is stopping; reconnect "
                                                       "after its restart")


def test_a_reader_that_stops_mid_chunk_resumes_after_the_last_event_it_took():
    reader = state()
    events = reader.feed(b"".join(b'{"id":%d,"row":{"n":%d}}\n' % (i, i) for i in (1, 2, 3)))
    assert reader.last_event_id == 3
    reader.given(events, 0)
    assert reader.last_event_id == 1 and reader.headers()["Last-Event-ID"] == "1"


def test_lost_connections_are_retried_then_given_up(monkeypatch):
    reader = state(reconnect_timeout=10)
    with pytest.raises(Unreachable, match="cannot reach the gateway at http://gw:80: refused"):
        reader.lost("refused")  # never connected: nothing to resume
    assert isinstance(reader.lost("503", wait=1.0), Disconnected)  # the gateway asked to wait
    reader.answered(200, None, None)
    delays = [reader.lost("reset").retry_in for _ in range(7)]
    assert delays == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    clock = [1000.0]
    monkeypatch.setattr("xsg_client._core.time.monotonic", lambda: clock[0])
    reader.lost_at = 995.0
    assert reader.lost("reset").retry_in == 5.0
    clock[0] = 1005.0
    with pytest.raises(ConnectionLost) as lost:
        reader.lost("reset")
    assert lost.value.last_event_id is None and "after 10 s" in str(lost.value)


def test_a_malformed_line_is_named():
    with pytest.raises(XsgError, match="not JSON: b'{\"id\":2,'"):
        state().feed(b'{"id":1,"row":{"n":1}}\n{"id":2,\n')


TYPES = {"s": {"ts": "timestamp", "x": "double", "n": "long", "who": "string",
               "t": "double", "lvl": "label"},
         "r": {"rt": "timestamp", "m": "long", "name": "string"}}
S = StreamSchema(tuple(Field(n, t) for n, t in TYPES["s"].items() if t != "label"))
R = StreamSchema(tuple(Field(n, t) for n, t in TYPES["r"].items()))


def time_window(stream: str, time_attribute: str, aggregates: tuple[Aggregate, ...],
                keys: tuple[str, ...] = ()) -> ExecutionPlan:
    attributes = tuple(dict.fromkeys((time_attribute, *keys, *(a.attribute for a in aggregates))))
    return ExecutionPlan(stream, None, attributes,
                         WindowSpec("time", 10, 10, aggregates, time_attribute, keys=keys))


@pytest.mark.parametrize("plan", [
    ExecutionPlan("s", None, ("ts", "x", "n", "who")),
    ExecutionPlan("s", None, ("ts", "n", "who"), masks=(("n", "hash"), ("ts", "truncate:hour"))),
    time_window("s", "ts", (Aggregate("x", "avg"), Aggregate("n", "sum"), Aggregate("n", "count"),
                            Aggregate("ts", "lastval"), Aggregate("who", "max")), keys=("who",)),
    time_window("s", "t", (Aggregate("n", "min"),)),
])
def test_the_schema_of_a_plan_is_the_gateways(plan):
    """A plain or time-windowed plan: the types the gateway's own analysis gives its outputs."""
    derived = schema_from_plan(plan_to_json(plan), TYPES)
    assert [(c.name, c.type) for c in derived.columns] == list(side_outputs(plan, S).items())


def test_the_schema_of_a_join_and_of_a_tuple_window():
    left = time_window("s", "ts", (Aggregate("x", "avg"),), keys=("n",))
    right = time_window("r", "rt", (Aggregate("m", "max"), Aggregate("name", "firstval")))
    join = JoinPlan(left, right, (("n", "max_m"),), 0.0, "window_end", "window_end")
    derived = schema_from_plan(plan_to_json(join), TYPES)
    expected = [(f"s.{n}", t) for n, t in side_outputs(left, S).items()] \
        + [(f"r.{n}", t) for n, t in side_outputs(right, R).items()]
    assert [(c.name, c.type) for c in derived.columns] == expected
    assert derived.names == tuple(plan_to_json(join)["output"])
    # tuple windows: the bounds are the indices of the window's first and last tuple
    tuples = ExecutionPlan("s", None, ("x", "lvl"),
                           WindowSpec("tuple", 5, 2, (Aggregate("x", "avg"),
                                                      Aggregate("lvl", "lub"))))
    assert [(c.name, c.type) for c in schema_from_plan(plan_to_json(tuples), TYPES).columns] == [
        ("window_start", "long"), ("window_end", "long"), ("avg_x", "double"),
        ("lub_lvl", "string")]
