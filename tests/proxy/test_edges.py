"""Which edge the proxy reads a handle from (proxy/edges.py): rendezvous order per handle."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from proxy.edges import EdgeChooser, edge_urls

EDGES = [f"http://10.0.0.{i}:8091" for i in range(1, 5)]
HANDLES = [f"h{i:04d}-{i * 7919 % 10007}" for i in range(4000)]


def test_a_handle_keeps_its_edge_and_handles_spread_evenly():
    chooser = EdgeChooser(EDGES)
    first = {h: chooser.order(h)[0] for h in HANDLES}
    assert first == {h: EdgeChooser(list(reversed(EDGES))).order(h)[0] for h in HANDLES}
    counts = Counter(first.values())
    assert set(counts) == set(EDGES)
    assert max(counts.values()) / min(counts.values()) < 1.25, counts


def test_an_edge_removed_moves_only_its_own_handles():
    before = EdgeChooser(EDGES)
    after = EdgeChooser(EDGES[1:])
    moved = [h for h in HANDLES if before.order(h)[0] != after.order(h)[0]]
    assert moved and all(before.order(h)[0] == EDGES[0] for h in moved)
    # and each goes to its second choice: the same one every proxy with these edges picks
    assert all(after.order(h)[0] == before.order(h)[1] for h in moved)


def test_an_edge_down_is_tried_last_until_its_time_is_over():
    chooser = EdgeChooser(EDGES, down_for=60)
    handle = HANDLES[0]
    usual = chooser.order(handle)
    chooser.mark_down(usual[0], "refused a connection")
    assert chooser.order(handle) == usual[1:] + usual[:1]
    back = EdgeChooser(EDGES, down_for=0)
    back.mark_down(usual[0], "refused a connection")
    assert back.order(handle) == usual


@pytest.mark.parametrize(("value", "why"), [
    ("edge-1:8091", "http(s) base URL"), ("ftp://e:21", "http(s) base URL"),
    ("http://e:1?x=1", "http(s) base URL"), ("http://e:1,http://e:1/", "named twice")])
def test_the_edges_flag_is_checked(value, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        edge_urls(value)


def test_the_edges_flag_reads_a_list():
    assert edge_urls(" http://a:1/, https://b:2 ,") == ("http://a:1", "https://b:2")
    assert edge_urls("") == ()
