import pytest

from pdp import datatypes as dt
from pdp.errors import Indeterminate
from pdp.functions import get_function, higher_order
from tests.pdp.functions.helpers import call, fid

F1 = "urn:oasis:names:tc:xacml:1.0:function:"
F3 = "urn:oasis:names:tc:xacml:3.0:function:"


def fn(short):
    return get_function(fid(short))


def test_any_of_and_all_of_with_bag_anywhere():
    assert call("any-of", fn("string-equal"), "b", ("a", "b")) is True
    assert call("any-of", fn("integer-greater-than"), (1, 2, 9), 5) is True   # bag first
    assert call("all-of", fn("integer-greater-than"), 10, (1, 2, 9)) is True
    assert call("all-of", fn("integer-greater-than"), 5, (1, 2, 9)) is False
    assert call("any-of", fn("string-equal"), "z", ()) is False
    assert call("all-of", fn("string-equal"), "z", ()) is True
    # 3.0 allows several primitive arguments around the bag.
    assert call("any-of", fn("time-in-range"), (dt.get_datatype(dt.TIME).parse("10:00:00Z"),),
                dt.get_datatype(dt.TIME).parse("09:00:00Z"),
                dt.get_datatype(dt.TIME).parse("11:00:00Z")) is True


def test_legacy_ids_behave_like_3_0():
    assert get_function(F1 + "any-of").impl(fn("string-equal"), "a", ("a",)) is True
    assert get_function(F1 + "all-of").impl(fn("string-equal"), "a", ("a", "b")) is False
    assert get_function(F1 + "map").impl(fn("string-normalize-to-lower-case"), ("A", "B")) == \
        ("a", "b")


def test_bag_count_errors():
    with pytest.raises(Indeterminate, match="any-of"):
        call("any-of", fn("string-equal"), "a", "b")
    with pytest.raises(Indeterminate, match="any-of"):
        call("any-of", fn("string-equal"), ("a",), ("b",))


def test_any_of_any():
    assert call("any-of-any", fn("string-equal"), ("a", "b"), ("c", "b")) is True
    assert call("any-of-any", fn("string-equal"), ("a", "b"), ("c", "d")) is False
    assert call("any-of-any", fn("integer-less-than"), 3, (1, 5)) is True
    assert call("any-of-any", fn("string-equal"), (), ("a",)) is False


def test_nested_quantifiers():
    gt = fn("integer-greater-than")
    assert call("all-of-any", gt, (10, 20), (1, 15)) is True
    assert call("all-of-any", gt, (10, 20), (11, 25)) is False
    assert call("any-of-all", gt, (3, 5), (1, 4)) is True
    assert call("any-of-all", gt, (3, 4), (1, 4)) is False
    assert call("all-of-all", gt, (6, 5), (1, 4)) is True
    assert call("all-of-all", gt, (6, 3), (1, 4)) is False
    assert call("all-of-any", gt, (), (1,)) is True
    assert call("any-of-all", gt, (), (1,)) is False
    assert call("all-of-all", gt, (1,), ()) is True


def test_map():
    assert call("map", fn("string-normalize-to-lower-case"), ("A", "bC")) == ("a", "bc")
    # Arguments after the bag (conformance test MapFunction.ArgsAfterBag).
    assert call("map", fn("string-substring"), ("Hello", "World"), 0, 1) == ("H", "W")
    assert call("map", fn("integer-add"), 1, (1, 2)) == (2, 3)
    assert call("map", fn("integer-abs"), ()) == ()
    assert get_function(F3 + "map").result_type(fn("integer-abs")) == (dt.INTEGER, True)


def test_map_propagates_indeterminate():
    with pytest.raises(Indeterminate, match="string-substring"):
        call("map", fn("string-substring"), ("Hello", "W"), 0, 3)


def test_indeterminate_applications_follow_or_and_semantics():
    match = fn("string-regexp-match")  # "(" is a bad pattern: that application is Indeterminate
    assert call("any-of", match, ("(", "b"), "abc") is True
    assert call("all-of", match, ("(", "z"), "abc") is False
    with pytest.raises(Indeterminate, match="regexp"):
        call("any-of", match, ("(", "z"), "abc")
    with pytest.raises(Indeterminate, match="regexp"):
        call("all-of", match, ("(", "b"), "abc")
    assert call("any-of-all", match, ("(", "b"), ("abc", "bcd")) is True
    with pytest.raises(Indeterminate):
        call("all-of-any", match, ("(", "b"), ("abc",))


def test_lazy_inner_functions_receive_thunks():
    assert call("any-of", fn("and"), True, (False, True)) is True
    assert call("all-of", fn("or"), False, (False, True)) is False


def test_inner_must_be_a_first_order_function():
    with pytest.raises(Indeterminate, match="higher-order"):
        call("any-of", fn("any-of"), "a", ("a",))
    with pytest.raises(Indeterminate, match="boolean"):
        call("any-of", fn("string-normalize-space"), ("a",))


def test_applications_are_bounded(monkeypatch):
    monkeypatch.setattr(higher_order, "MAX_APPLICATIONS", 50)
    with pytest.raises(Indeterminate, match="applications"):
        call("any-of-any", fn("integer-equal"), tuple(range(10)), tuple(range(100, 110)))
    with pytest.raises(Indeterminate, match="applications"):
        call("all-of-all", fn("integer-less-than"), tuple(range(10)), tuple(range(100, 110)))
    with pytest.raises(Indeterminate, match="applications"):
        call("map", fn("integer-abs"), tuple(range(51)))
