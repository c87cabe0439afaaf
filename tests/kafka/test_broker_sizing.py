"""The broker `heap_for` sizes (bench_edges, `make kafka`) leaves its old generation room over
the live set measured with plan topics written and read: with 448 MB at 1,000 topics the old
generation (~300 MB) was full, and the broker ran 18 full GCs in 18 s while a micro-batch
waited on its acknowledgements (issue 45, `tests/bench/bench_edges_split.py`)."""
from __future__ import annotations

from tests.kafka.broker import heap_for

# MB live after full GCs, 1,000 plan topics, bench_edges' traffic (20,000 rows/s, two edges)
LIVE_MB_AT_1000 = 300
TOPIC_KB = 40  # heap per topic's log (420 MB live with 10,000 topics)


def old_generation_mb(heap: str) -> float:
    """SerialGC's old generation: two thirds of the heap (NewRatio 2)."""
    assert heap.endswith("m"), heap
    return int(heap[:-1]) * 2 / 3


def test_old_generation_is_twice_the_live_set() -> None:
    assert old_generation_mb(heap_for(1000)) >= 2 * LIVE_MB_AT_1000, heap_for(1000)


def test_each_topic_adds_its_log() -> None:
    for topics in (1000, 5000, 10000):
        more = int(heap_for(topics + 1000)[:-1]) - int(heap_for(topics)[:-1])
        assert more * 1024 >= TOPIC_KB * 1000, (topics, more)  # MB per 1,000 topics
