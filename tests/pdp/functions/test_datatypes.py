import math
from decimal import Decimal

import pytest

from pdp import datatypes as dt
from pdp.errors import ValueSyntaxError
from tests.pdp.functions.helpers import v


def test_every_mandatory_datatype_is_registered():
    for uri in (dt.STRING, dt.BOOLEAN, dt.INTEGER, dt.DOUBLE, dt.TIME, dt.DATE, dt.DATETIME,
                dt.ANYURI, dt.HEXBINARY, dt.BASE64BINARY, dt.DAYTIMEDURATION,
                dt.YEARMONTHDURATION, dt.LEGACY_DAYTIMEDURATION, dt.LEGACY_YEARMONTHDURATION,
                dt.X500NAME, dt.RFC822NAME, dt.IPADDRESS, dt.DNSNAME):
        assert dt.get_datatype(uri).id == uri


def test_unknown_datatype_is_a_key_error():
    with pytest.raises(KeyError, match="nope"):
        dt.get_datatype("urn:nope")


def test_legacy_duration_ids_are_the_same_type():
    assert dt.same_datatype(dt.LEGACY_DAYTIMEDURATION, dt.DAYTIMEDURATION)
    assert not dt.same_datatype(dt.DAYTIMEDURATION, dt.YEARMONTHDURATION)
    legacy = dt.get_datatype(dt.LEGACY_YEARMONTHDURATION).parse("P1Y")
    assert legacy == v("yearMonthDuration", "P12M")


@pytest.mark.parametrize("short,bad", [
    ("integer", "12a"), ("integer", "1.0"), ("integer", ""), ("boolean", "yes"),
    ("boolean", "TRUE"), ("double", "inf"), ("double", "1,5"), ("double", "Infinity"),
    ("date", "2002-02-30"), ("date", "2002-13-01"), ("dateTime", "2002-03-22 08:23:47"),
    ("dateTime", "2002-03-22T25:00:00"), ("time", "08:23"), ("time", "08:23:47+15:00"),
    ("dayTimeDuration", "P1Y"), ("dayTimeDuration", "PT"), ("dayTimeDuration", "P"),
    ("yearMonthDuration", "P1D"), ("yearMonthDuration", "-P"), ("hexBinary", "ABC"),
    ("hexBinary", "GG"), ("base64Binary", "abc"), ("rfc822Name", "nobody"),
    ("rfc822Name", "@x.com"), ("x500Name", "cn"), ("ipAddress", "300.1.1.1"),
    ("ipAddress", "10.0.0.1:99999"), ("ipAddress", "10.0.0.1:80-70"), ("dnsName", "a..b"),
    ("dnsName", "host:abc"), ("ipAddress", "::1"),
])
def test_bad_lexical_values_name_type_and_value(short, bad):
    with pytest.raises(ValueSyntaxError) as info:
        v(short, bad)
    assert short in str(info.value)
    assert repr(bad) in str(info.value)


def test_whitespace_trimmed_except_for_strings():
    assert v("integer", " \n 42\t") == 42
    assert v("boolean", " true ") is True
    assert v("string", "  padded ") == "  padded "
    assert v("anyURI", " http://x/ ") == "http://x/"


def test_integers_are_unbounded_and_doubles_have_special_values():
    assert v("integer", "123456789012345678901234567890") == 123456789012345678901234567890
    assert v("integer", "+5") == 5
    assert v("double", "INF") == math.inf
    assert v("double", "-INF") == -math.inf
    assert math.isnan(v("double", "NaN"))
    assert dt.values_equal(v("double", "NaN"), float("nan"))
    assert v("double", "NaN") is dt.NAN and dt.equality_key(float("nan")) is dt.NAN
    assert v("double", ".5e1") == 5.0
    fmt = dt.get_datatype(dt.DOUBLE).format
    assert [fmt(x) for x in (math.inf, -math.inf, math.nan, 27.5, 1e300)] == \
        ["INF", "-INF", "NaN", "27.5", "1.0E300"]


def test_boolean_lexical_forms():
    assert v("boolean", "1") is True and v("boolean", "0") is False
    assert dt.get_datatype(dt.BOOLEAN).format(False) == "false"


def test_binary_types():
    assert v("hexBinary", "0bf7") == v("hexBinary", "0BF7") == b"\x0b\xf7"
    assert dt.get_datatype(dt.HEXBINARY).format(b"\x0b\xf7") == "0BF7"
    assert v("base64Binary", "c3Vy\n ZS4=") == b"sure."
    assert dt.get_datatype(dt.BASE64BINARY).format(b"sure.") == "c3VyZS4="


def test_datetime_equality_across_timezones_and_implicit_utc():
    assert v("dateTime", "2002-03-22T08:23:47-05:00") == v("dateTime", "2002-03-22T13:23:47Z")
    assert v("dateTime", "2002-03-22T13:23:47") == v("dateTime", "2002-03-22T13:23:47+00:00")
    assert v("dateTime", "2002-03-22T13:23:47.000") == v("dateTime", "2002-03-22T13:23:47Z")
    assert v("dateTime", "2002-03-22T08:23:47-05:00") < v("dateTime", "2002-03-22T13:23:48Z")
    assert len({v("dateTime", "2002-03-22T08:23:47-05:00"),
                v("dateTime", "2002-03-22T14:23:47+01:00")}) == 1


def test_datetime_end_of_day_and_far_years():
    assert v("dateTime", "1999-12-31T24:00:00Z") == v("dateTime", "2000-01-01T00:00:00Z")
    assert v("dateTime", "-0044-03-15T12:00:00") < v("dateTime", "0001-01-01T00:00:00")
    assert v("dateTime", "12345-01-01T00:00:00Z") > v("dateTime", "9999-12-31T23:59:59Z")
    assert v("date", "2000-02-29") == v("date", "2000-02-29Z")
    with pytest.raises(ValueSyntaxError):
        v("date", "1900-02-29")


def test_date_and_time_ordering_follow_xpath():
    # A date is compared by the instant its day starts.
    assert v("date", "2002-03-22+10:00") < v("date", "2002-03-22Z")
    # Times are compared on one reference day, so 23:00-05:00 is after 05:00Z.
    assert v("time", "23:00:00-05:00") > v("time", "05:00:00Z")
    assert v("time", "21:30:00+10:30") == v("time", "06:00:00-05:00")
    assert v("time", "08:00:00+09:00") != v("time", "17:00:00-06:00")
    assert v("time", "24:00:00") == v("time", "00:00:00")


def test_temporal_formatting_keeps_timezone_and_fraction():
    def fmt(uri, x):
        return dt.get_datatype(uri).format(x)

    assert fmt(dt.DATETIME, v("dateTime", "2002-03-22T08:23:47.250-05:00")) == \
        "2002-03-22T08:23:47.25-05:00"
    assert fmt(dt.TIME, v("time", "08:23:47")) == "08:23:47"
    assert fmt(dt.DATE, v("date", "-0044-03-15Z")) == "-0044-03-15Z"


def test_durations():
    assert v("dayTimeDuration", "P1DT2H") == v("dayTimeDuration", "PT26H")
    assert v("dayTimeDuration", "PT0S") == v("dayTimeDuration", "-P0D")
    assert v("dayTimeDuration", "PT1.5S").seconds == Decimal("1.5")
    assert v("dayTimeDuration", "-PT1S") < v("dayTimeDuration", "PT0S")
    fmt = dt.get_datatype(dt.DAYTIMEDURATION).format
    assert fmt(v("dayTimeDuration", "P12DT148H18M21S")) == "P18DT4H18M21S"
    assert fmt(v("dayTimeDuration", "-PT90.50S")) == "-PT1M30.5S"
    assert fmt(v("dayTimeDuration", "PT0S")) == "PT0S"
    assert v("yearMonthDuration", "P1Y2M") == v("yearMonthDuration", "P14M")
    assert dt.get_datatype(dt.YEARMONTHDURATION).format(v("yearMonthDuration", "-P27M")) == \
        "-P2Y3M"


def test_rfc822_name_case_rules():
    assert v("rfc822Name", "Anderson@SUN.COM") == v("rfc822Name", "Anderson@sun.com")
    assert v("rfc822Name", "anderson@sun.com") != v("rfc822Name", "Anderson@sun.com")
    assert str(v("rfc822Name", "j_hibbert@MEDICO.COM")) == "j_hibbert@MEDICO.COM"


def test_x500_name_normalization():
    a = v("x500Name", "cn=Julius Hibbert, o=Medi Corporation, c=US")
    b = v("x500Name", "CN=julius  hibbert,O=Medi Corporation,C=us")
    assert a == b and hash(a) == hash(b)
    assert v("x500Name", "cn=A+uid=7, c=US") == v("x500Name", "uid=7+cn=A,c=US")
    assert v("x500Name", r"cn=Smith\, John, c=US").rdns[0] == (("cn", "smith, john"),)
    assert v("x500Name", "cn=A, c=US") != v("x500Name", "cn=A, c=UK")
    assert str(a) == "cn=Julius Hibbert, o=Medi Corporation, c=US"


def test_ip_address_forms():
    ip = v("ipAddress", "122.45.38.245/255.255.255.64:8080")
    assert str(ip.address) == "122.45.38.245" and str(ip.mask) == "255.255.255.64"
    assert ip.ports == dt.PortRange(8080, 8080)
    assert dt.get_datatype(dt.IPADDRESS).format(ip) == "122.45.38.245/255.255.255.64:8080"
    v6 = v("ipAddress", "[2001:DB8::1]/[ffff:ffff::]:-1024")
    assert v6.address.version == 6 and v6.ports == dt.PortRange(None, 1024)
    assert v6 == v("ipAddress", "[2001:db8:0::1]/[FFFF:FFFF::]:-1024")
    assert v("ipAddress", "10.0.0.1:80-") != v("ipAddress", "10.0.0.1:80")
    assert v("ipAddress", "10.0.0.1").ports is None


def test_dns_name_forms():
    d = v("dnsName", "some.host.name:147-874")
    assert d.ports == dt.PortRange(147, 874)
    assert d == v("dnsName", "SOME.host.Name:147-874")
    assert str(v("dnsName", "a.different.host:-45")) == "a.different.host:-45"
    assert v("dnsName", "*.example.com").host == "*.example.com"
    assert v("dnsName", "*.example.com").ports is None


def test_all_values_hashable_and_round_trip():
    samples = {
        "string": " x ", "boolean": "true", "integer": "-7", "double": "2.5E3",
        "time": "08:23:47.5Z", "date": "2002-03-22-05:00", "dateTime": "2002-03-22T08:23:47",
        "anyURI": "urn:x", "hexBinary": "00ff", "base64Binary": "AAE=",
        "dayTimeDuration": "P1DT1S", "yearMonthDuration": "P1Y", "x500Name": "cn=a,c=US",
        "rfc822Name": "a@b.c", "ipAddress": "[::1]:80", "dnsName": "example.com:443",
    }
    for short, lexical in samples.items():
        datatype = dt.get_datatype(dt.JSON_SHORTHANDS[short])
        value = datatype.parse(lexical)
        hash(value)
        assert datatype.is_value(value)
        assert datatype.parse(datatype.format(value)) == value, short


def test_bool_is_not_an_integer_value():
    assert not dt.get_datatype(dt.INTEGER).is_value(True)
    assert dt.get_datatype(dt.INTEGER).is_value(3)


def test_hostile_sizes_are_refused():
    with pytest.raises(ValueSyntaxError):
        v("integer", "9" * 5000)
    with pytest.raises(ValueSyntaxError):
        v("dateTime", "9" * 100 + "-01-01T00:00:00")


def test_json_profile_values():
    assert dt.get_datatype(dt.INTEGER).parse_json(5) == 5
    assert dt.get_datatype(dt.INTEGER).parse_json("5") == 5
    assert dt.get_datatype(dt.DOUBLE).parse_json(5) == 5.0
    assert dt.get_datatype(dt.DOUBLE).parse_json("NaN") is dt.NAN
    assert dt.get_datatype(dt.BOOLEAN).parse_json(False) is False
    assert dt.get_datatype(dt.STRING).parse_json(" a ") == " a "
    for datatype, bad in ((dt.INTEGER, True), (dt.INTEGER, 5.5), (dt.STRING, 3),
                          (dt.BOOLEAN, 1), (dt.DATE, None)):
        with pytest.raises(ValueSyntaxError):
            dt.get_datatype(datatype).parse_json(bad)
