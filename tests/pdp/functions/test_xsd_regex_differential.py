"""Differential test: on the syntax that XPath and Python share (literals, classes, groups,
alternation, quantifiers, anchors) the linear-time engine must agree with Python's `re`."""
import random
import re

from pdp.functions.xsd_regex import compile_xsd_regex

ATOMS = ["a", "b", "c", ".", "[ab]", "[^a]", r"\d", "1"]


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.15 and depth < 3:
            atom = "(" + _random_pattern(rng, depth + 1) + ")"
        elif roll < 0.2 and depth < 3:
            atom = (
                "(" + _random_pattern(rng, depth + 1) + "|" + _random_pattern(rng, depth + 1) + ")"
            )
        else:
            atom = rng.choice(ATOMS)
        quant = rng.choice(["", "", "", "*", "+", "?", "{2}", "{0,2}", "{1,}", "*?"])
        parts.append(atom + quant)
    text = "".join(parts)
    if rng.random() < 0.3:
        text = "^" + text
    if rng.random() < 0.3:
        text = text + "$"
    if depth == 0 and rng.random() < 0.2:
        text = text + "|" + rng.choice(ATOMS)
    return text


def test_agrees_with_python_re_on_shared_syntax():
    rng = random.Random(20261122)
    checked = 0
    for _ in range(1500):
        pattern = _random_pattern(rng)
        subject = "".join(rng.choice("abc1") for _ in range(rng.randint(0, 8)))
        expected = re.search(pattern, subject) is not None
        assert compile_xsd_regex(pattern).search(subject) is expected, (pattern, subject)
        checked += 1
    assert checked == 1500
