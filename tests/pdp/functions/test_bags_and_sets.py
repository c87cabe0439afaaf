import math

import pytest

from pdp.errors import Indeterminate
from pdp.functions import FUNCTIONS
from pdp.functions.base import MAX_BAG_SIZE, TYPED_FAMILIES
from tests.pdp.functions.helpers import call, v


def test_every_type_has_bag_and_set_functions():
    for name, _uri, prefix in TYPED_FAMILIES:
        for suffix in ("one-and-only", "bag-size", "is-in", "bag", "intersection",
                       "at-least-one-member-of", "union", "subset", "set-equals"):
            assert f"{prefix}{name}-{suffix}" in FUNCTIONS


def test_one_and_only():
    assert call("string-one-and-only", ("a",)) == "a"
    for bag in ((), ("a", "b")):
        with pytest.raises(Indeterminate) as info:
            call("string-one-and-only", bag)
        assert "string-one-and-only" in info.value.message


def test_bag_size_is_in_and_bag():
    assert call("integer-bag-size", (1, 1, 2)) == 3
    assert call("integer-is-in", 2, (1, 2)) is True
    assert call("integer-is-in", 5, ()) is False
    assert call("double-is-in", float("nan"), (1.0, math.nan)) is True
    assert call("double-is-in", math.nan, (1.0,)) is False
    assert call("string-bag", "a", "b", "a") == ("a", "b", "a")
    assert call("string-bag") == ()
    assert call("rfc822Name-is-in", v("rfc822Name", "a@X.com"), (v("rfc822Name", "a@x.com"),))


def test_bag_constructor_is_bounded():
    with pytest.raises(Indeterminate, match="integer-bag"):
        call("integer-bag", *range(MAX_BAG_SIZE + 1))


def test_set_functions():
    a, b = (1, 2, 2, 3), (3, 4, 2)
    assert call("integer-intersection", a, b) == (2, 3)
    assert call("integer-union", a, b) == (1, 2, 3, 4)
    assert call("integer-union", (1,), (2,), (1, 3)) == (1, 2, 3)
    assert call("integer-at-least-one-member-of", a, b) is True
    assert call("integer-at-least-one-member-of", (1,), (2,)) is False
    assert call("integer-subset", (2, 2, 3), a) is True
    assert call("integer-subset", a, b) is False
    assert call("integer-subset", (), ()) is True
    assert call("integer-set-equals", (1, 2, 2), (2, 1)) is True
    assert call("integer-set-equals", (1,), (1, 2)) is False


def test_set_functions_treat_nan_as_one_value():
    nan_a, nan_b = float("nan"), float("nan")
    assert len(call("double-union", (nan_a, 1.0), (nan_b,))) == 2
    assert call("double-set-equals", (nan_a,), (nan_b, nan_a)) is True
    assert call("double-subset", (nan_a,), (2.0, nan_b)) is True
    assert len(call("double-intersection", (nan_a, 1.0), (nan_b,))) == 1


def test_set_functions_use_type_equality():
    x1 = v("x500Name", "cn=A, o=B, c=US")
    x2 = v("x500Name", "CN=a,O=b,C=us")
    assert call("x500Name-set-equals", (x1,), (x2,)) is True
    dt1 = v("dateTime", "2002-03-22T08:00:00-05:00")
    dt2 = v("dateTime", "2002-03-22T13:00:00Z")
    assert call("dateTime-intersection", (dt1,), (dt2,)) == (dt1,)
    assert call("dayTimeDuration-union", (v("dayTimeDuration", "P1D"),),
                (v("dayTimeDuration", "PT24H"),)) == (v("dayTimeDuration", "P1D"),)
