"""64-bit integers and microsecond timestamps compare exactly in the pure core (issue 21, part 3).

A filter `account = 9007199254740993` on a long attribute must not hand out account
9007199254740992, which a comparison through doubles does. Checked against Python's own
integers and fractions: (a) binding and evaluation of conditions, (b) the NR/PR analysis
against brute force over a small domain near 2^53 (and near a far timestamp's microsecond).
"""
from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import example, given, settings, strategies as st

from pep.core.analysis import analyse_filter
from pep.core.conditions import ConditionError, evaluate, parse_condition
from pep.core.exact import (
    INT64_MAX,
    INT64_MIN,
    integer_comparison,
    iso_from_micros,
    micros_from_iso,
)
from pep.core.plan import Field, Predicate, StreamSchema

SCHEMA = StreamSchema((Field("n", "long"), Field("x", "double"), Field("t", "timestamp")))
P53, P63 = 2 ** 53, 2 ** 63
OPS = ("<", "<=", ">", ">=", "=", "!=")
PY = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
      ">=": lambda a, b: a >= b, "=": lambda a, b: a == b, "!=": lambda a, b: a != b}
SUBJECT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"

# long values near the places a double cannot tell neighbours apart, and near the ends
CENTRES = (P53, -P53, P63 - 1, -P63, 0, 10 ** 18)
longs = st.builds(lambda c, d: max(INT64_MIN, min(INT64_MAX, c + d)),
                  st.sampled_from(CENTRES), st.integers(-4, 4))
# constants as written: integers (also beyond 64 bits), halves, .0 decimals, exponents
literal_texts = st.one_of(
    st.builds(lambda c, d: str(c + d), st.sampled_from(CENTRES + (P63, -P63 - 1, 2 ** 64)),
              st.integers(-4, 4)),
    st.builds(lambda c, d, frac: f"{c + d}.{frac}", st.sampled_from(CENTRES),
              st.integers(-4, 4), st.sampled_from(["0", "5", "25", "0000000001", "9999999"])),
    st.sampled_from(["1e30", "-1e30", "9.007199254740993e15", "9.223372036854775807E18",
                     "-9.223372036854775808e18", "0.5e1"]),
)


def exact(text: str) -> Fraction:
    return Fraction(Decimal(text))


@settings(max_examples=400, deadline=None)
@given(longs, st.sampled_from(OPS), literal_texts)
@example(P53, "=", str(P53 + 1))  # the report: 2^53 is not account 2^53 + 1
@example(P53 + 1, "=", str(P53 + 1))
@example(P53, ">", "9007199254740992.5")
@example(P53 + 1, ">", "9007199254740992.5")
@example(P63 - 1, "<", "1e30")
@example(-P63, ">", "-1e30")
def test_a_long_comparison_is_pythons_integer_comparison(value, op, text):
    expr = parse_condition(f"n {op} {text}", SCHEMA)
    assert isinstance(expr.value, int) and INT64_MIN <= expr.value <= INT64_MAX
    assert evaluate(expr, {"n": value}) is PY[op](value, exact(text))
    assert evaluate(expr, {"n": None}) is False  # a missing value fails every comparison


@settings(max_examples=200, deadline=None)
@given(longs, st.lists(literal_texts, min_size=1, max_size=5), st.booleans())
def test_in_and_not_in_on_longs_are_exact(value, texts, negated):
    expr = parse_condition(f"n {'NOT ' if negated else ''}IN ({', '.join(texts)})", SCHEMA)
    inside = any(value == exact(t) for t in texts)
    assert evaluate(expr, {"n": value}) is (inside != negated)
    assert evaluate(expr, {"n": None}) is False


@settings(max_examples=200, deadline=None)
@given(longs, st.sampled_from(OPS), literal_texts, st.lists(literal_texts, max_size=4))
def test_placeholders_bind_integers_exactly(value, op, text, bag):
    values = {"one": [text], "bag": bag}

    def resolver(category, attribute):
        assert category == SUBJECT
        return values[attribute]

    one = parse_condition(f"n {op} {{subject:one}}", SCHEMA, resolver=resolver)
    assert evaluate(one, {"n": value}) is PY[op](value, exact(text))
    member = parse_condition("n IN {subject:bag}", SCHEMA, resolver=resolver)
    assert evaluate(member, {"n": value}) is any(value == exact(t) for t in bag)


def test_the_reported_filter_and_its_rewrites():
    assert parse_condition("n = 9007199254740993", SCHEMA).value == 9007199254740993
    assert not evaluate(parse_condition("n = 9007199254740993", SCHEMA), {"n": P53})
    # a decimal literal is exact: > 2^53 + 0.5 is >= 2^53 + 1
    gt = parse_condition("n > 9007199254740992.5", SCHEMA)
    assert (gt.op, gt.value) == (">", P53)
    lt = parse_condition("n < 9007199254740992.5", SCHEMA)
    assert (lt.op, lt.value) == ("<=", P53)
    # a value of no long: = never holds, != on every present value
    assert (parse_condition("n = 2.5", SCHEMA).op, parse_condition("n = 2.5", SCHEMA).value) \
        == (">", INT64_MAX)
    ne = parse_condition("n != 2.5", SCHEMA)
    assert (ne.op, ne.value) == ("<=", INT64_MAX)
    assert evaluate(ne, {"n": 3}) and not evaluate(ne, {"n": None})
    # beyond 64 bits: decided, never wrapped
    assert not evaluate(parse_condition("n > 99999999999999999999", SCHEMA), {"n": INT64_MAX})
    assert evaluate(parse_condition("n > -99999999999999999999", SCHEMA), {"n": INT64_MIN})
    # a double attribute keeps double semantics: the constant is rounded as its values are
    assert parse_condition("x = 9007199254740993", SCHEMA).value == float(P53)


def test_integer_comparison_is_an_equivalence_over_the_domain():
    low, high = -5, 5
    for op in OPS:
        for q in [Fraction(k, 2) for k in range(-16, 17)] + [Fraction(10**30), Fraction(-10**30)]:
            new_op, n = integer_comparison(op, q, low, high)
            assert low <= n <= high
            assert [PY[op](v, q) for v in range(low, high + 1)] == \
                [PY[new_op](v, n) for v in range(low, high + 1)], (op, q)


# -- timestamps: whole microseconds, exactly ----------------------------------------------------

FAR = micros_from_iso("9999-12-31T23:59:59.999990Z")  # epoch seconds as a double lose micros here


@settings(max_examples=300, deadline=None)
@given(st.integers(-4, 4), st.sampled_from(OPS), st.integers(-4, 4),
       st.sampled_from(["", "5", "0000001", "9"]))
def test_a_timestamp_comparison_is_exact_at_the_microsecond(dv, op, dc, extra):
    value = FAR + dv
    constant = iso_from_micros(FAR + dc)[:-1] + extra + "Z"  # maybe a fraction of a micro more
    expr = parse_condition(f"t {op} '{constant}'", SCHEMA)
    want = PY[op](Fraction(value), Fraction(micros_from_iso(constant)))
    # rows carry timestamps as the gateway delivers them: fixed-width text
    assert evaluate(expr, {"t": iso_from_micros(value)}) is want
    seconds = Fraction(micros_from_iso(constant), 10 ** 6)
    by_number = parse_condition(f"t {op} {_decimal(seconds)}", SCHEMA)  # epoch seconds
    assert evaluate(by_number, {"t": iso_from_micros(value)}) is want


def _decimal(value: Fraction) -> str:
    """An exact decimal text of a fraction with a power-of-ten denominator."""
    digits = 0
    while (value * 10 ** digits).denominator != 1:
        digits += 1
    scaled = value * 10 ** digits
    return str(Decimal(scaled.numerator).scaleb(-digits))


def test_timestamp_constants_out_of_range_are_still_refused():
    with pytest.raises(ConditionError, match="years 1 to 9999"):
        parse_condition("t > 253402300800", SCHEMA)
    with pytest.raises(ConditionError, match="years 1 to 9999"):
        parse_condition("t > '0001-01-01T00:00:00.5+01:00'", SCHEMA)


# -- (b) the analysis against brute force near 2^53 ---------------------------------------------

WINDOW = range(P53 - 4, P53 + 5)
near = st.builds(lambda d, half: f"{P53 + d}.5" if half else str(P53 + d),
                 st.integers(-5, 5), st.booleans())
atom = st.builds(lambda op, c: f"n {op} {c}", st.sampled_from(OPS), near)
member = st.builds(lambda neg, cs: f"n {'NOT ' if neg else ''}IN ({', '.join(cs)})",
                   st.booleans(), st.lists(near, min_size=1, max_size=3))
leaf = st.one_of(atom, atom, member)
formula = st.recursive(leaf, lambda inner: st.one_of(
    st.builds(lambda a, b: f"({a} AND {b})", inner, inner),
    st.builds(lambda a, b: f"({a} OR {b})", inner, inner),
    st.builds(lambda a: f"NOT ({a})", inner)), max_leaves=5)
BOUNDS = f"n >= {WINDOW[0]} AND n <= {WINDOW[-1]}"


def holds(text: str, value: int | None) -> bool:
    return evaluate(parse_condition(text, SCHEMA), {"n": value})


@settings(max_examples=300, deadline=None)
@given(formula, formula)
@example(f"n > {P53} AND n < {P53 + 2}", "n != 0")
@example(f"n > {P53} AND n < {P53 + 2} AND n != {P53 + 1}", "n != 0")
def test_nr_pr_and_the_merged_filter_match_brute_force_near_2_53(policy_text, user_text):
    policy = parse_condition(f"{BOUNDS} AND ({policy_text})", SCHEMA)
    user = parse_condition(user_text, SCHEMA)
    result = analyse_filter(policy, user, SCHEMA)
    both = [v for v in WINDOW if evaluate(policy, {"n": v}) and evaluate(user, {"n": v})]
    assert result.nr is (not both)
    if result.nr:
        assert result.filter_dnf == ()
    else:
        # the plan's filter passes exactly the values both conditions pass
        def passes(v):
            return result.filter_dnf is None or any(
                all(PY[p.op](v, p.value) for p in conj) for conj in result.filter_dnf)
        assert [v for v in WINDOW if passes(v)] == both
        assert not passes(WINDOW[0] - 1) and not passes(WINDOW[-1] + 1)
        for conj in result.filter_dnf or ():
            assert all(isinstance(p.value, int) for p in conj)
    # PR: a tuple the user's condition asks for is withheld by the policy (the bounded user
    # condition keeps the witness inside the window)
    bounded_user = parse_condition(f"{BOUNDS} AND ({user_text})", SCHEMA)
    pr = analyse_filter(policy, bounded_user, SCHEMA)
    withheld = [v for v in WINDOW if evaluate(bounded_user, {"n": v})
                and not evaluate(policy, {"n": v})]
    if not pr.nr:
        assert pr.pr is bool(withheld)


def test_one_long_between_two_neighbours_and_none_without_it():
    one = analyse_filter(parse_condition(f"n > {P53} AND n < {P53 + 2}", SCHEMA), None, SCHEMA)
    assert not one.nr and one.filter_dnf == ((Predicate("n", "=", P53 + 1),),)
    none = analyse_filter(parse_condition(f"n > {P53} AND n < {P53 + 2} AND n != {P53 + 1}",
                                          SCHEMA), None, SCHEMA)
    assert none.nr
    assert analyse_filter(parse_condition("n > 9223372036854775807", SCHEMA), None, SCHEMA).nr
    assert analyse_filter(parse_condition("n = 2.5", SCHEMA), None, SCHEMA).nr
    # the user asks for 2^53 + 1 only; a policy pinning 2^53 gives nothing (NR), not a neighbour
    nr = analyse_filter(parse_condition(f"n = {P53}", SCHEMA),
                        parse_condition(f"n = {P53 + 1}", SCHEMA), SCHEMA)
    assert nr.nr


def test_timestamps_are_analysed_over_microseconds():
    a, b = iso_from_micros(FAR), iso_from_micros(FAR + 2)
    one = analyse_filter(parse_condition(f"t > '{a}' AND t < '{b}'", SCHEMA), None, SCHEMA)
    assert one.filter_dnf == ((Predicate("t", "=", iso_from_micros(FAR + 1)),),)
    assert analyse_filter(parse_condition(
        f"t > '{a}' AND t < '{b}' AND t != '{iso_from_micros(FAR + 1)}'", SCHEMA),
        None, SCHEMA).nr
    # nothing lies between a microsecond and the next
    assert analyse_filter(parse_condition(
        f"t > '{a}' AND t < '{iso_from_micros(FAR + 1)}'", SCHEMA), None, SCHEMA).nr
    # doubles stay dense
    assert not analyse_filter(parse_condition("x > 1 AND x < 1.0000000000000002", SCHEMA),
                              None, SCHEMA).nr
