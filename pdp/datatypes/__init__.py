"""XACML 3.0 data types: their identifiers, Python value classes, parsing and formatting.

This package keeps the public names; each family lives in its own module: `ids` (the
identifiers), `temporal` (date, dateTime, time), `durations`, `names` (x500Name, rfc822Name),
`net` (ipAddress, dnsName), `scalars` (boolean, numbers, binary, anyURI, equality) and
`registry` (DataType and the lookups by identifier).

Every value the PDP computes with is an immutable, hashable Python object whose `==` is the
XACML equality of its type, so that bags can be compared with plain Python and values can sit
in sets. The mapping is:

    string, anyURI            -> str
    boolean                   -> bool
    integer                   -> int (unbounded)
    double                    -> float (INF, -INF, NaN allowed)
    hexBinary, base64Binary   -> bytes
    date, dateTime, time      -> XSDate, XSDateTime, XSTime
    dayTimeDuration           -> DayTimeDuration   (also the legacy xquery-operators id)
    yearMonthDuration         -> YearMonthDuration (also the legacy xquery-operators id)
    x500Name                  -> X500Name
    rfc822Name                -> Rfc822Name
    ipAddress                 -> IPAddressValue
    dnsName                   -> DNSNameValue

Doubles are the one exception to "`==` is XACML equality": the conformance suite (IIC350,
IIC358) requires double-equal(NaN, NaN) to be True, as Java's Double.equals has it, while a
Python float NaN is unequal to itself. Use `values_equal` / `equality_key` when comparing
values generically; every NaN this package produces is the single object `NAN`.

Implicit timezone: a date, time or dateTime written without a timezone is compared as if it
were in UTC (XPath leaves the implicit timezone to the implementation; a fixed one keeps
decisions reproducible across machines). The value remembers that it had no timezone, so it
is formatted back without one.

Lexical values of every type except string are trimmed of XML whitespace before parsing, as the
XML Schema whitespace facet `collapse` demands; strings are taken verbatim.
"""
from __future__ import annotations

from pdp.datatypes.durations import (
    DayTimeDuration,
    YearMonthDuration,
    add_year_month,
    date_add_yearmonth,
    datetime_add_daytime,
    datetime_add_yearmonth,
)
from pdp.datatypes.ids import (
    ANYURI,
    BASE64BINARY,
    BOOLEAN,
    DATE,
    DATETIME,
    DAYTIMEDURATION,
    DNSNAME,
    DOUBLE,
    HEXBINARY,
    INTEGER,
    IPADDRESS,
    LEGACY_DAYTIMEDURATION,
    LEGACY_XQ,
    LEGACY_YEARMONTHDURATION,
    RFC822NAME,
    STRING,
    TIME,
    X500NAME,
    XPATHEXPRESSION,
    XS,
    YEARMONTHDURATION,
)
from pdp.datatypes.names import Rfc822Name, X500Name
from pdp.datatypes.net import DNSNameValue, IPAddressValue, PortRange
from pdp.datatypes.registry import (
    DATATYPES,
    JSON_SHORTHANDS,
    DataType,
    canonical_datatype_id,
    get_datatype,
    same_datatype,
)
from pdp.datatypes.scalars import NAN, equality_key, format_double, values_equal
from pdp.datatypes.temporal import XSDate, XSDateTime, XSTime

__all__ = [
    "ANYURI", "BASE64BINARY", "BOOLEAN", "DATATYPES", "DATE", "DATETIME", "DAYTIMEDURATION",
    "DNSNAME", "DNSNameValue", "DOUBLE", "DataType", "DayTimeDuration", "HEXBINARY", "INTEGER",
    "IPADDRESS", "IPAddressValue", "JSON_SHORTHANDS", "LEGACY_DAYTIMEDURATION", "LEGACY_XQ",
    "LEGACY_YEARMONTHDURATION", "NAN", "PortRange", "RFC822NAME", "Rfc822Name", "STRING",
    "TIME", "X500NAME", "X500Name", "XPATHEXPRESSION", "XS", "XSDate", "XSDateTime", "XSTime",
    "YEARMONTHDURATION", "YearMonthDuration", "add_year_month", "canonical_datatype_id",
    "date_add_yearmonth", "datetime_add_daytime", "datetime_add_yearmonth", "equality_key",
    "format_double", "get_datatype", "same_datatype", "values_equal",
]
