"""NR/PR analysis and the plan's DNF: the paper's Examples 3 and 4, the theory per attribute type,
bounds, and a property test against brute force over exhaustive small domains."""
import itertools

import pytest
import sympy
from hypothesis import HealthCheck, given, settings, strategies as st
from sympy.logic.boolalg import to_dnf

from pep.core.analysis import Checker, ConditionTooComplex, MergeWarning, analyse_filter, to_nnf
from pep.core.conditions import And, Comparison, Not, Or, evaluate, parse_condition
from pep.core.plan import Field, Predicate, StreamSchema

A = StreamSchema((Field("a", "double"), Field("b", "double")))
MIXED = StreamSchema((Field("x", "double"), Field("n", "long"), Field("s", "string"),
                      Field("f", "boolean")))


def run(policy, user, schema=A, **kw):
    p = parse_condition(policy, schema) if policy else None
    u = parse_condition(user, schema) if user else None
    return analyse_filter(p, u, schema, **kw)


def test_example_3_partial_result():
    r = run("a > 8", "a > 5")
    assert not r.nr and r.pr is True
    (w,) = r.warnings
    assert (w.kind, w.operator) == ("PR", "filter")
    assert w.predicates == ("a > 8",) and "a <= 8" in w.message
    assert r.filter_dnf == ((Predicate("a", ">", 8.0),),)  # a > 5 AND a > 8 -> a > 8


def test_example_3_no_result():
    r = run("a < 4", "a > 5")
    assert r.nr and r.filter_dnf == ()
    (w,) = r.warnings
    assert (w.kind, w.operator) == ("NR", "filter")
    assert set(w.predicates) == {"a < 4", "a > 5"}
    assert "a < 4 (policy) contradicts a > 5 (your query)" in w.message


def test_example_4_no_result_names_both_conflicts():
    r = run("(a > 20 AND a < 30) OR NOT (a != 40)", "NOT (a >= 10) AND b = 20")
    assert r.nr and r.filter_dnf == ()
    (w,) = r.warnings
    assert w.kind == "NR"
    # the predicates as written, NOTs included (issue 42); the NOT-free forms the paper's
    # Example 4 reasons with follow each one's "i.e."
    assert set(w.predicates) == {"a > 20", "NOT a >= 10", "NOT a != 40"}
    assert "a > 20 (policy) contradicts NOT a >= 10 (your query, i.e. a < 10)" in w.message
    assert "NOT a != 40 (policy, i.e. a = 40) contradicts NOT a >= 10 (your query, i.e. a < 10)" \
        in w.message


def test_no_warning_when_the_user_condition_implies_the_policy():
    r = run("a > 5", "a > 8 AND b = 1")
    assert r.warnings == () and r.pr is False and not r.nr
    assert r.filter_dnf == ((Predicate("a", ">", 8.0), Predicate("b", "=", 1.0)),)


def test_simplification_and_pruning():
    assert run("a > 5", "a >= 5 AND a > 8 AND a < 100 AND a <= 100").filter_dnf == (
        (Predicate("a", ">", 8.0), Predicate("a", "<", 100.0)),)
    assert run("a >= 5 AND a <= 5", None).filter_dnf == ((Predicate("a", "=", 5.0),),)
    assert run("a >= 5 AND a != 5", None).filter_dnf == ((Predicate("a", ">", 5.0),),)
    # a contradictory alternative is dropped; a weaker alternative absorbs a stronger one
    assert run("(a > 5 AND a < 3) OR b = 1", None).filter_dnf == ((Predicate("b", "=", 1.0),),)
    assert run("b = 1 OR (b = 1 AND a > 2)", None).filter_dnf == ((Predicate("b", "=", 1.0),),)
    assert run("a > 1 OR NOT (a > 1)", None).filter_dnf == (
        (Predicate("a", ">", 1.0),), (Predicate("a", "<=", 1.0),))
    assert run(None, None).filter_dnf is None and run("true", "true").filter_dnf is None
    assert run("false", None).filter_dnf == () and run("false", None).nr


def test_long_attributes_are_integers():
    assert run("n > 5 AND n < 6", None, MIXED).nr
    assert run("n > 5.5 AND n < 6.5", None, MIXED).filter_dnf == ((Predicate("n", "=", 6),),)
    assert run("n >= 1 AND n <= 3 AND n != 2 AND n != 1 AND n != 3", None, MIXED).nr
    assert run("n = 2.5", None, MIXED).nr
    assert run("n > 5", None, MIXED).filter_dnf == ((Predicate("n", ">=", 6),),)
    assert not run("x > 5 AND x < 6", None, MIXED).nr  # doubles are dense


def test_strings_including_ordering():
    assert run("s = 'a' AND s = 'b'", None, MIXED).nr
    assert run("s > 'b' AND s < 'a'", None, MIXED).nr
    assert not run("s > 'a' AND s < 'b'", None, MIXED).nr
    assert run("s > 'a' AND s < 'a\\0'", None, MIXED).nr  # nothing lies between s and s + NUL
    assert run("s >= 'a' AND s < 'a\\0' AND s != 'a'", None, MIXED).nr
    assert run("s < ''", None, MIXED).nr
    assert not run("s <= '' ", None, MIXED).nr
    assert run("s <= '' AND s != ''", None, MIXED).nr
    r = run("s != 'x'", "s = 'x'", MIXED)
    assert r.nr and set(r.warnings[0].predicates) == {"s != 'x'", "s = 'x'"}


def test_booleans():
    assert run("f != true AND f != false", None, MIXED).nr
    assert run("f != true", None, MIXED).filter_dnf == ((Predicate("f", "=", False),),)


def test_missing_attributes_make_a_tautology_partial():
    # the policy holds for every present value of a, but a tuple without a is withheld
    r = run("a > 5 OR a <= 5", "b > 8")
    assert r.pr is True and "a is missing" in r.warnings[0].message
    assert run("a > 5 OR a <= 5", "b > 8 AND a = 3").pr is False


def test_pr_when_the_user_has_no_filter():
    r = run("a > 5", None)
    assert r.pr is True and r.warnings[0].predicates == ("a > 5",)


WIDE = StreamSchema(tuple(Field(f"{c}{i}", "double") for c in "cd" for i in range(12)))


def test_too_large_to_analyse_is_a_warning_and_still_enforced():
    # NOT(policy) is an AND of nine two-way ORs over distinct attributes: 512 alternatives
    policy = " OR ".join(f"(c{i} > 1 AND d{i} > 1)" for i in range(9))
    r = run(policy, None, WIDE, analysis_limit=256)
    assert r.pr is None and not r.nr
    (w,) = r.warnings
    assert w.kind == "INFO" and "too large to analyse" in w.message
    assert len(r.filter_dnf) == 9  # the policy itself is enforced exactly


def test_plan_limit_refuses_instead_of_approximating():
    user = " AND ".join(f"(c{i} > 1 OR d{i} > 1)" for i in range(11))  # 2048 alternatives
    with pytest.raises(ConditionTooComplex, match="too complex"):
        run(None, user, WIDE)
    ok = " AND ".join(f"(c{i} > 1 OR d{i} > 1)" for i in range(10))  # 1024: still exact
    assert len(run(None, ok, WIDE).filter_dnf) == 1024


def test_contradictions_are_pruned_while_expanding():
    user = " AND ".join(f"(c0 = {i} OR d0 = {i})" for i in range(12))  # 4096 before pruning
    assert run(None, user, WIDE).nr


def test_warning_is_a_dataclass_with_json():
    w = MergeWarning("PR", "map", "m", ("x",))
    assert w.to_json() == {"kind": "PR", "operator": "map", "message": "m", "predicates": ["x"]}


# -- sympy as an oracle for the boolean part of the DNF ------------------------------------------

BOOLS = StreamSchema(tuple(Field(c, "boolean") for c in "pqrstu"))
_atom = st.sampled_from("pqrstu").map(lambda c: Comparison(c, "=", True))
_bool_expr = st.recursive(
    _atom, lambda kids: st.one_of(
        st.lists(kids, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(kids, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
        kids.map(Not)), max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(_bool_expr)
def test_dnf_is_equivalent_to_sympys(expr):
    symbols = {c: sympy.Symbol(c) for c in "pqrstu"}

    def to_sympy(e):
        if isinstance(e, Comparison):
            return symbols[e.attribute] if e.op == "=" and e.value else ~symbols[e.attribute]
        if isinstance(e, Not):
            return ~to_sympy(e.item)
        parts = [to_sympy(i) for i in e.items]
        return sympy.And(*parts) if isinstance(e, And) else sympy.Or(*parts)

    checker = Checker(BOOLS)
    ours = checker.dnf(to_nnf(expr, "user"), 10_000, prune=False)
    ours_sympy = sympy.Or(*[sympy.And(*[symbols[a.attribute] if a.op == "=" else
                                        ~symbols[a.attribute] for a in conj]) for conj in ours])
    reference = to_dnf(to_sympy(expr))
    assert sympy.satisfiable(sympy.Xor(ours_sympy, reference)) is False


# -- property test: verdicts against brute force ---------------------------------------------------

CONSTANTS = {"x": [-1.0, 0.0, 2.5, 4.0], "n": [-1, 0, 1.5, 3], "s": ["", "a", "a\0", "ab", "b"],
             "f": [True, False]}


def _representatives(attr):
    """Every region of the attribute's domain that the constants distinguish, plus missing."""
    consts = CONSTANTS[attr]
    if attr == "x":
        c = sorted(consts)
        reps = (
            set(c) | {c[0] - 1, c[-1] + 1} | {(u + v) / 2 for u, v in zip(c, c[1:], strict=False)}
        )
    elif attr == "n":
        reps = set(range(-2, 5))
    elif attr == "s":
        reps = set(consts) | {c + "\0" for c in consts}
    else:
        reps = {True, False}
    return sorted(reps, key=repr) + [None]


_ops = {"x": ["<", "<=", ">", ">=", "=", "!="], "n": ["<", "<=", ">", ">=", "=", "!="],
        "s": ["<", "<=", ">", ">=", "=", "!="], "f": ["=", "!="]}
_cmp = st.sampled_from(sorted(CONSTANTS)).flatmap(
    lambda attr: st.builds(Comparison, st.just(attr), st.sampled_from(_ops[attr]),
                           st.sampled_from(CONSTANTS[attr])))
_expr = st.recursive(
    _cmp, lambda kids: st.one_of(
        st.lists(kids, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(kids, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
        kids.map(Not)), max_leaves=6)


def _attrs(e, out):
    if isinstance(e, Comparison):
        out.add(e.attribute)
    elif isinstance(e, Not):
        _attrs(e.item, out)
    elif e is not None:
        for i in e.items:
            _attrs(i, out)
    return out


def _dnf_holds(dnf, row):
    if dnf is None:
        return True
    ops = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           ">=": lambda a, b: a >= b, "=": lambda a, b: a == b, "!=": lambda a, b: a != b}
    return any(all(row.get(p.attribute) is not None and ops[p.op](row[p.attribute], p.value)
                   for p in conj) for conj in dnf)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_expr, st.one_of(st.none(), _expr))
def test_verdicts_match_brute_force(policy, user):
    result = analyse_filter(policy, user, MIXED)
    attrs = sorted(_attrs(policy, _attrs(user, set())))
    nr_truth, pr_truth = True, False
    for values in itertools.product(*[_representatives(a) for a in attrs]):
        row = dict(zip(attrs, values, strict=True))
        p = evaluate(policy, row)
        u = True if user is None else evaluate(user, row)
        if p and u:
            nr_truth = False
        if u and not p:
            pr_truth = True
        assert _dnf_holds(result.filter_dnf, row) == (p and u), row
    assert result.nr == nr_truth
    if result.pr is not None and not result.nr:
        assert result.pr == pr_truth
    assert any(w.kind == "NR" for w in result.warnings) == nr_truth
