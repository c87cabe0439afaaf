"""Each walkthrough of the documentation, run top to bottom against a fresh gateway (issue 42).

The steps and the answers the pages show are the files of `examples/<walkthrough>/` (the pages
include them), so a page cannot say one thing while the gateway does another: see
`walkthrough.py` for how a step is run and how its answer is compared. One gateway per
walkthrough, started once for it; those that open no handle start no Spark.
"""
from __future__ import annotations

import pytest

from tests.docs.walkthrough import EXAMPLES, matches, run_walkthrough, steps_of

# walkthrough folder -> the `xsg serve` flags its gateway needs beyond the runner's own
WALKTHROUGHS: dict[str, tuple[str, ...]] = {
    "quickstart": (),
    "policies": (),
    "streams": ("--no-start-spark",),
    "joins": (),
    "masks": (),
    "resharing": (),
    "punctuations": (),
}


@pytest.mark.parametrize("name", sorted(WALKTHROUGHS))
def test_walkthrough(name, tmp_path):
    run_walkthrough(name, tmp_path, WALKTHROUGHS[name])


def test_every_walkthrough_folder_is_run():
    folders = {p.parent.name for p in EXAMPLES.glob("*/[0-9][0-9]-*.sh")}
    assert folders == set(WALKTHROUGHS)
    for name in WALKTHROUGHS:
        assert steps_of(EXAMPLES / name)


def test_how_answers_are_compared():
    assert matches('{"id":"...","state":"released"}\n', '{"id":"abc","state":"released"}')
    assert not matches('{"id":"...","state":"released"}', '{"id":"abc","state":"revoked"}')
    assert matches("a\n...\nz\n", "a\nb\nc\nz\n") and matches("a\n...\nz", "a\nz")
    assert not matches("a\nz", "a\nb\nz")
    assert matches("", "") and not matches("", "something")
    assert matches("x ... y", "x 1\n2 y") is False  # `...` in a line never spans lines
