import math

import pytest

from pdp.errors import Indeterminate
from pdp.results import STATUS_PROCESSING_ERROR
from tests.pdp.functions.helpers import call, v


def test_integer_arithmetic():
    assert call("integer-add", 1, 2, 3) == 6
    assert call("integer-subtract", 1, 5) == -4
    assert call("integer-multiply", 2, 3, 7) == 42
    assert call("integer-abs", -9) == 9
    assert call("integer-add", 10**30, 1) == 10**30 + 1


@pytest.mark.parametrize("a,b,q,r", [(7, 2, 3, 1), (-7, 2, -3, -1), (7, -2, -3, 1),
                                     (-7, -2, 3, -1)])
def test_integer_divide_and_mod_truncate_toward_zero(a, b, q, r):
    assert call("integer-divide", a, b) == q
    assert call("integer-mod", a, b) == r


@pytest.mark.parametrize("name,args", [("integer-divide", (1, 0)), ("integer-mod", (1, 0)),
                                       ("double-divide", (1.0, 0.0))])
def test_division_by_zero_is_indeterminate_naming_the_function(name, args):
    with pytest.raises(Indeterminate) as info:
        call(name, *args)
    assert info.value.status_code == STATUS_PROCESSING_ERROR
    assert name in info.value.message


def test_integer_growth_is_bounded():
    with pytest.raises(Indeterminate, match="integer-multiply"):
        call("integer-multiply", *([10**4000] * 30))


def test_double_arithmetic_and_special_values():
    assert call("double-add", 1.5, 2.25, -1.0) == 2.75
    assert call("double-subtract", 1.0, math.inf) == -math.inf
    assert call("double-multiply", 2.0, 3.5) == 7.0
    assert call("double-divide", 1.0, 4.0) == 0.25
    assert call("double-abs", -2.5) == 2.5
    assert math.isnan(call("double-add", math.nan, 1.0))


@pytest.mark.parametrize("x,rounded,floored", [(2.5, 3.0, 2.0), (-2.5, -2.0, -3.0),
                                               (2.4999, 2.0, 2.0), (-0.6, -1.0, -1.0),
                                               (0.49999999999999994, 0.0, 0.0)])
def test_round_half_up_and_floor(x, rounded, floored):
    assert call("round", x) == rounded
    assert call("floor", x) == floored


def test_round_keeps_infinity():
    assert call("round", math.inf) == math.inf
    assert math.isnan(call("floor", math.nan))


def test_numeric_conversions():
    assert call("double-to-integer", -7.9) == -7
    assert call("double-to-integer", 1e20) == 100000000000000000000
    assert call("integer-to-double", 3) == 3.0
    with pytest.raises(Indeterminate, match="double-to-integer"):
        call("double-to-integer", math.nan)
    with pytest.raises(Indeterminate, match="integer-to-double"):
        call("integer-to-double", 10**400)


def test_comparisons():
    assert call("integer-greater-than", 3, 2) is True
    assert call("integer-less-than-or-equal", 3, 3) is True
    assert call("double-less-than", 1.0, math.nan) is False
    assert call("double-greater-than-or-equal", math.nan, 1.0) is False
    assert call("string-less-than", "Z", "a") is True  # code point order
    assert call("dateTime-greater-than", v("dateTime", "2002-03-22T08:23:47-05:00"),
                v("dateTime", "2002-03-22T13:00:00Z")) is True
    assert call("date-less-than", v("date", "2002-03-21"), v("date", "2002-03-22")) is True
    assert call("time-greater-than-or-equal", v("time", "09:00:00"), v("time", "09:00:00Z"))


def test_equality_functions():
    assert call("integer-equal", 3, 3) and not call("integer-equal", 3, 4)
    assert call("double-equal", 0.0, -0.0)
    # NaN equals NaN for double-equal (conformance IIC350/IIC358), whatever object it is.
    assert call("double-equal", math.nan, float("nan"))
    assert not call("double-equal", math.nan, math.inf)
    assert call("double-equal", call("double-add", math.nan, 1.0), v("double", "NaN"))
    assert call("string-equal-ignore-case", "ABC", "abc")
    assert not call("string-equal", "ABC", "abc")
    assert call("x500Name-equal", v("x500Name", "cn=A, c=US"), v("x500Name", "CN=a,C=us"))
    assert call("rfc822Name-equal", v("rfc822Name", "a@X.com"), v("rfc822Name", "a@x.COM"))
    assert not call("rfc822Name-equal", v("rfc822Name", "A@x.com"), v("rfc822Name", "a@x.com"))
    assert call("dayTimeDuration-equal", v("dayTimeDuration", "P1D"),
                v("dayTimeDuration", "PT24H"))
    assert call("hexBinary-equal", b"\x01", b"\x01")


@pytest.mark.parametrize("value,low,high,expected", [
    ("10:00:00Z", "09:00:00Z", "17:00:00Z", True),
    ("17:00:00Z", "09:00:00Z", "17:00:00Z", True),
    ("17:00:01Z", "09:00:00Z", "17:00:00Z", False),
    ("23:30:00Z", "22:00:00Z", "02:00:00Z", True),   # wraps past midnight
    ("01:00:00Z", "22:00:00Z", "02:00:00Z", True),
    ("03:00:00Z", "22:00:00Z", "02:00:00Z", False),
    ("10:00:00-05:00", "09:00:00", "11:00:00", True),  # bounds take the value's timezone
    ("10:00:00-05:00", "14:00:00Z", "16:00:00Z", True),
    ("10:00:00-05:00", "09:00:00Z", "11:00:00Z", False),
])
def test_time_in_range(value, low, high, expected):
    assert call("time-in-range", v("time", value), v("time", low), v("time", high)) is expected
