import pytest

from pdp import datatypes as dt
from pdp.errors import Indeterminate
from pdp.functions import base
from tests.pdp.functions.helpers import call, v


def test_normalization():
    assert call("string-normalize-space", " \t a  b \n") == "a  b"
    assert call("string-normalize-to-lower-case", "HeLLo") == "hello"


def test_concatenation_and_its_bound(monkeypatch):
    assert call("string-concatenate", "a", "b", "c") == "abc"
    assert call("uri-string-concatenate", "http://x/", "a", "b") == "http://x/ab"
    big = "x" * (base.MAX_STRING_CHARS // 2 + 1)
    with pytest.raises(Indeterminate, match="string-concatenate"):
        call("string-concatenate", big, big)


def test_prefix_suffix_contains_take_the_pattern_first():
    assert call("string-starts-with", "ab", "abc") is True
    assert call("string-starts-with", "abc", "ab") is False
    assert call("string-ends-with", "bc", "abc") is True
    assert call("string-contains", "b", "abc") is True
    assert call("string-contains", "B", "abc") is False
    assert call("anyURI-starts-with", "http://", "http://x/y") is True
    assert call("anyURI-ends-with", "/y", "http://x/y") is True
    assert call("anyURI-contains", "x/", "http://x/y") is True


def test_substring():
    assert call("string-substring", "Hello World", 0, 5) == "Hello"
    assert call("string-substring", "Hello World", 6, -1) == "World"
    assert call("string-substring", "abc", 3, -1) == ""
    assert call("anyURI-substring", "http://x/y", 7, 8) == "x"
    for begin, end in ((-2, 8), (4, 2), (0, 99), (99, -1)):
        with pytest.raises(Indeterminate, match="string-substring"):
            call("string-substring", "abc", begin, end)
    with pytest.raises(Indeterminate, match="anyURI-substring"):
        call("anyURI-substring", "http://x", -1, 2)


@pytest.mark.parametrize("short,lexical", [
    ("boolean", "true"), ("integer", "-12"), ("double", "2.5"), ("time", "08:00:00Z"),
    ("date", "2002-03-22"), ("dateTime", "2002-03-22T08:00:00-05:00"), ("anyURI", "urn:a"),
    ("dayTimeDuration", "P1DT2H"), ("yearMonthDuration", "P1Y2M"),
    ("x500Name", "cn=A, c=US"), ("rfc822Name", "a@B.com"), ("ipAddress", "10.0.0.1:80"),
    ("dnsName", "example.com:80-90"),
])
def test_from_string_and_back(short, lexical):
    value = call(f"{short}-from-string", lexical)
    assert value == v(short, lexical)
    text = call(f"string-from-{short}", value)
    assert isinstance(text, str)
    assert call(f"{short}-from-string", text) == value


def test_from_string_rejects_bad_lexical_values():
    with pytest.raises(Indeterminate) as info:
        call("integer-from-string", "twelve")
    assert "integer-from-string" in info.value.message and "twelve" in info.value.message
    with pytest.raises(Indeterminate, match="boolean-from-string"):
        call("boolean-from-string", "yes")


def test_string_from_canonical_forms():
    assert call("string-from-boolean", True) == "true"
    assert call("string-from-double", float("-inf")) == "-INF"
    assert call("string-from-dayTimeDuration", v("dayTimeDuration", "PT36H")) == "P1DT12H"
    assert call("string-from-integer", 10**20) == "100000000000000000000"
    assert dt.JSON_SHORTHANDS["ipAddress"] == dt.IPADDRESS
