"""The one parser for numbers from the outside world (common/numbers.py, issue 19): ASCII digits
only, a sign only where negatives are meaningful, bounded text and range, NaN and the infinities
refused, and a refusal that names the field."""
from __future__ import annotations

import argparse
import math
import sys
import unicodedata

import pytest
from hypothesis import given, settings, strategies as st

from common.numbers import (
    INT64_MAX,
    MAX_TEXT,
    NumberError,
    check_float,
    check_int,
    float_argument,
    int_argument,
    parse_float,
    parse_int,
)

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)

# Every character str.isdigit(), str.isdecimal() or str.isnumeric() accepts, but ASCII's ten:
# '²', '①', '٣', '５', '𝟗', '৩', '½', 'Ⅻ', '〇' ... (int() takes the decimal ones, isdigit the
# superscripts that int() then refuses)
NON_ASCII_DIGITS = [chr(c) for c in range(0x80, sys.maxunicode + 1)
                    if not 0xD800 <= c <= 0xDFFF
                    and (chr(c).isdigit() or chr(c).isdecimal() or chr(c).isnumeric())]
ascii_digits = st.text(alphabet="0123456789", min_size=1, max_size=18)


def test_the_non_ascii_digit_list_is_the_whole_unicode_range():
    assert len(NON_ASCII_DIGITS) > 1500
    assert {"²", "①", "٣", "５", "𝟗", "½"} <= set(NON_ASCII_DIGITS)
    assert unicodedata.decimal("٣") == 3 and int("٣") == 3  # what the parser must not follow


@SETTINGS
@given(digits=ascii_digits)
def test_ascii_digits_are_accepted_with_their_value(digits):
    assert parse_int(digits, "n") == int(digits)
    assert parse_int(f" {digits}\t", "n") == int(digits)
    assert parse_float(digits, "x", low=0, high=1e18) == float(digits)


@SETTINGS
@given(digit=st.sampled_from(NON_ASCII_DIGITS), prefix=st.text("0123456789", max_size=3),
       suffix=st.text("0123456789", max_size=3))
def test_every_non_ascii_digit_is_refused(digit, prefix, suffix):
    text = prefix + digit + suffix
    with pytest.raises(NumberError) as error:
        parse_int(text, "query parameter 'after'")
    assert "query parameter 'after'" in str(error.value) and "ASCII" in str(error.value)
    with pytest.raises(NumberError):
        parse_float(text, "hold", low=0, high=1e9)
    with pytest.raises(NumberError):
        parse_float(prefix + "." + digit, "hold", low=0, high=1e9)


@SETTINGS
@given(value=st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
       low=st.integers(min_value=-(2 ** 64), max_value=2 ** 64),
       span=st.integers(min_value=0, max_value=2 ** 64))
def test_bounds_are_inclusive_and_kept(value, low, span):
    high = low + span
    inside = low <= value <= high and (value >= 0 or low < 0)
    if inside:
        assert parse_int(str(value), "n", low=low, high=high) == value
        assert check_int(value, "n", low=low, high=high) == value
    else:
        with pytest.raises(NumberError, match="must be a whole number from"):
            parse_int(str(value), "n", low=low, high=high)
    if not low <= value <= high:
        with pytest.raises(NumberError):
            check_int(value, "n", low=low, high=high)


@pytest.mark.parametrize("text", [
    "", " ", "-", "+1", "1_000", "1 000", "0x10", "1e3", "1.0", "١", "²", "①", "\u00a01",
    "1\n", "1\x00", "٣", "𝟗", "9" * (MAX_TEXT + 1), "9" * 5000, "--1", "1-", None, 5, b"5"])
def test_odd_integer_texts_are_refused(text):
    with pytest.raises(NumberError):
        parse_int(text, "header Last-Event-ID")


def test_a_minus_sign_only_where_negatives_are_meaningful():
    with pytest.raises(NumberError):
        parse_int("-1", "n")
    with pytest.raises(NumberError):
        parse_int("-0", "n")
    assert parse_int("-5", "n", low=-10, high=10) == -5
    with pytest.raises(NumberError):
        parse_float("-0.5", "x", low=0, high=1)
    assert parse_float("-0.5", "x", low=-1, high=1) == -0.5


def test_long_texts_are_refused_before_any_conversion():
    # leading zeros up to the bound still read; one more character is refused unconverted
    assert parse_int("0" * (MAX_TEXT - 1) + "7", "n") == 7
    with pytest.raises(NumberError, match="ASCII digits"):
        parse_int("0" * MAX_TEXT + "7", "n")
    assert parse_int(str(INT64_MAX), "n") == INT64_MAX
    with pytest.raises(NumberError):
        parse_int(str(INT64_MAX + 1), "n")


@pytest.mark.parametrize("text", [
    "nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999", "1e", ".", "e5", "1.2.3",
    "0x1p3", "1_0.5", "٣.5", "1.²", "", "1e٣"])
def test_odd_float_texts_are_refused(text):
    with pytest.raises(NumberError):
        parse_float(text, "timeout", low=-1e9, high=1e9)


@SETTINGS
@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_floats_are_finite_and_in_range(value):
    text = repr(value)
    inside = math.isfinite(value) and -1e6 <= value <= 1e6
    if inside:
        assert parse_float(text, "x", low=-1e6, high=1e6) == value
        assert check_float(value, "x", low=-1e6, high=1e6) == value
    else:
        with pytest.raises(NumberError):
            parse_float(text, "x", low=-1e6, high=1e6)
        with pytest.raises(NumberError):
            check_float(value, "x", low=-1e6, high=1e6)


def test_typed_values_refuse_bools_and_the_wrong_kind():
    for bad in (True, False, 1.0, "1", None, [1]):
        with pytest.raises(NumberError, match="port must be a whole number"):
            check_int(bad, "port", low=0, high=65535)
    for bad in (True, "1.5", None, float("nan"), float("inf"), 10 ** 400):
        with pytest.raises(NumberError):
            check_float(bad, "hold", low=0, high=604800)
    assert check_float(3, "hold", low=0, high=10) == 3.0


def test_argparse_types_say_what_is_wrong():
    parser = argparse.ArgumentParser(prog="x", exit_on_error=False)
    parser.add_argument("--port", type=int_argument(1, 65535))
    parser.add_argument("--ttl", type=float_argument(0.001, 3600))
    args = parser.parse_args(["--port", "8081", "--ttl", "2.5"])
    assert (args.port, args.ttl) == (8081, 2.5)
    for argv in (["--port", "٣"], ["--port", "0"], ["--ttl", "nan"], ["--ttl", "inf"]):
        with pytest.raises(argparse.ArgumentError, match="must be a"):
            parser.parse_args(argv)
