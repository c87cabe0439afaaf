"""One live query per (subject, stream), tested with the paper's Example 2."""
import threading

import pytest

from pep.core.errors import Conflict
from pep.core.graph import QueryGraph, Source, WindowAggregate
from pep.core.merge import merge
from pep.core.obligations import policy_graph
from pep.core.plan import Aggregate, Field, StreamSchema, WindowSpec
from pep.handles.one_window import WindowConflict, WindowRegistry
from tests.pep.core.helpers import ob

S = StreamSchema((Field("a", "double"),))


def example_2_plan(size: int):
    """Policy: sum over tuple windows of size >= 3, step >= 2; the user asks for `size`."""
    policy = policy_graph((ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
                              ("stream-window-size-id", "3"), ("stream-window-step-id", "2"),
                              ("stream-window-attr-id", "a:sum")),), "s", S)
    user = QueryGraph(
        WindowAggregate(Source("s"), WindowSpec("tuple", size, 2, (Aggregate("a", "sum"),)))
    )
    return merge(policy, user, S).plan


def sums(stream, size, step):
    return [sum(stream[i:i + size]) for i in range(0, len(stream) - size + 1, step)]


def test_example_2_three_windows_would_rebuild_the_stream():
    # Why the rule exists: S2 - S1 and S3 - S2 interleave into the raw stream from a3 on.
    raw = [7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0]
    s1, s2, s3 = sums(raw, 3, 2), sums(raw, 4, 2), sums(raw, 5, 2)
    odd = [b - a for a, b in zip(s1, s2, strict=False)]  # a3, a5, a7, ...
    even = [c - b for b, c in zip(s2, s3, strict=False)]  # a4, a6, a8, ...
    rebuilt = [x for pair in zip(odd, even, strict=False) for x in pair]
    assert rebuilt == raw[3:3 + len(rebuilt)] and len(rebuilt) >= 6


def test_example_2_only_one_window_at_a_time():
    plans = [example_2_plan(n) for n in (3, 4, 5)]
    assert len({p.key() for p in plans}) == 3  # all three are allowed by the policy on their own
    reg = WindowRegistry()
    first, is_new = reg.acquire("eve", "s", plans[0].key())
    assert is_new
    assert reg.acquire("eve", "s", example_2_plan(3).key()) == (first, False)  # identical: same
    for other in plans[1:]:
        with pytest.raises(WindowConflict) as info:
            reg.acquire("eve", "s", other.key())
        assert info.value.existing_handle_id == first and first in info.value.message
        assert "release" in info.value.message and isinstance(info.value, Conflict)
    other_user, _ = reg.acquire("bob", "s", plans[1].key())  # other subjects are independent
    assert other_user != first
    assert reg.release(first) and not reg.release(first)
    second, is_new = reg.acquire("eve", "s", plans[1].key())
    assert is_new and second != first


def test_restore_after_restart():
    reg = WindowRegistry()
    reg.restore("eve", "s", "k1", "h1")
    reg.restore("eve", "s", "k1", "h1")  # idempotent
    assert reg.acquire("eve", "s", "k1") == ("h1", False)
    with pytest.raises(WindowConflict):
        reg.restore("eve", "s", "k2", "h2")
    with pytest.raises(ValueError):
        reg.restore("eve", "t", "k1", "h1")
    assert reg.booking("h1").stream == "s" and len(reg) == 1


def test_concurrent_acquires_book_one_slot():
    reg = WindowRegistry()
    results, conflicts = [], []
    barrier = threading.Barrier(8)

    def attempt(i):
        barrier.wait()
        try:
            results.append(reg.acquire("eve", "s", f"plan-{i % 2}"))
        except WindowConflict as exc:
            conflicts.append(exc.existing_handle_id)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handles = {h for h, _ in results}
    assert len(handles) == 1 and sum(new for _, new in results) == 1
    assert set(conflicts) <= handles and len(results) + len(conflicts) == 8
