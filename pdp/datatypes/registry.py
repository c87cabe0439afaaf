"""The data type registry: one DataType per identifier (parser, formatter, Python class), the
JSON Profile's short names, and the lookups by identifier."""
from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import InvalidOperation
from typing import Any

from pdp.datatypes.common import XML_WS
from pdp.datatypes.durations import (
    DayTimeDuration,
    YearMonthDuration,
    parse_daytime,
    parse_yearmonth,
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
    LEGACY_YEARMONTHDURATION,
    RFC822NAME,
    STRING,
    TIME,
    X500NAME,
    XPATHEXPRESSION,
    YEARMONTHDURATION,
)
from pdp.datatypes.names import Rfc822Name, X500Name, parse_rfc822, parse_x500
from pdp.datatypes.net import DNSNameValue, IPAddressValue, parse_dnsname, parse_ipaddress
from pdp.datatypes.scalars import (
    format_double,
    parse_anyuri,
    parse_base64,
    parse_boolean,
    parse_double,
    parse_hex,
    parse_integer,
)
from pdp.datatypes.temporal import (
    XSDate,
    XSDateTime,
    XSTime,
    parse_date,
    parse_datetime,
    parse_time,
)
from pdp.errors import ValueSyntaxError


@dataclass(frozen=True)
class DataType:
    """One XACML data type: identifier, lexical parser and canonical formatter."""

    id: str
    name: str
    python_type: type | tuple[type, ...]
    parser: Callable[[str], Any] = field(repr=False)
    formatter: Callable[[Any], str] = field(repr=False, default=str)
    trims_whitespace: bool = True

    def parse(self, lexical: str) -> Any:
        """Parses a lexical value; raises ValueSyntaxError naming the datatype and the value."""
        if not isinstance(lexical, str):
            raise ValueSyntaxError(f"invalid {self.name} value: expected text, got "
                                   f"{type(lexical).__name__}")
        text = lexical.strip(XML_WS) if self.trims_whitespace else lexical
        try:
            return self.parser(text)
        except (ValueError, ArithmeticError, InvalidOperation) as exc:
            shown = lexical if len(lexical) <= 80 else lexical[:77] + "..."
            raise ValueSyntaxError(f"invalid {self.name} value {shown!r}: {exc}") from None

    def parse_json(self, value: Any) -> Any:
        """Parses a value of the XACML JSON Profile, where integers and doubles may be JSON
        numbers and booleans JSON booleans; strings are parsed as lexical values."""
        if isinstance(value, str):
            return self.parse(value)
        base = canonical_datatype_id(self.id)
        if isinstance(value, bool):
            if base == BOOLEAN:
                return value
        elif isinstance(value, int):
            if base == INTEGER:
                return value
            if base == DOUBLE:
                return float(value)
        elif isinstance(value, float):
            if base == DOUBLE:
                return value
            if base == INTEGER and value.is_integer():
                return int(value)
        shown = repr(value)[:80]
        raise ValueSyntaxError(f"invalid {self.name} value {shown}: a JSON "
                               f"{type(value).__name__} cannot be a {self.name}")

    def format(self, value: Any) -> str:
        """The XACML lexical form of a value of this type."""
        return self.formatter(value)

    def is_value(self, value: Any) -> bool:
        """Whether a Python value is a value of this type (bool is not an integer)."""
        if self.python_type is int and isinstance(value, bool):
            return False
        return isinstance(value, self.python_type)


def _fmt_bool(value: bool) -> str:
    return "true" if value else "false"


def _fmt_b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


_ALL = [
    DataType(STRING, "string", str, lambda s: s, str, trims_whitespace=False),
    DataType(BOOLEAN, "boolean", bool, parse_boolean, _fmt_bool),
    DataType(INTEGER, "integer", int, parse_integer, str),
    DataType(DOUBLE, "double", float, parse_double, format_double),
    DataType(TIME, "time", XSTime, parse_time),
    DataType(DATE, "date", XSDate, parse_date),
    DataType(DATETIME, "dateTime", XSDateTime, parse_datetime),
    DataType(ANYURI, "anyURI", str, parse_anyuri, str),
    DataType(HEXBINARY, "hexBinary", bytes, parse_hex, lambda b: b.hex().upper()),
    DataType(BASE64BINARY, "base64Binary", bytes, parse_base64, _fmt_b64),
    DataType(DAYTIMEDURATION, "dayTimeDuration", DayTimeDuration, parse_daytime),
    DataType(YEARMONTHDURATION, "yearMonthDuration", YearMonthDuration, parse_yearmonth),
    DataType(LEGACY_DAYTIMEDURATION, "dayTimeDuration", DayTimeDuration, parse_daytime),
    DataType(LEGACY_YEARMONTHDURATION, "yearMonthDuration", YearMonthDuration, parse_yearmonth),
    DataType(X500NAME, "x500Name", X500Name, parse_x500),
    DataType(RFC822NAME, "rfc822Name", Rfc822Name, parse_rfc822),
    DataType(IPADDRESS, "ipAddress", IPAddressValue, parse_ipaddress),
    DataType(DNSNAME, "dnsName", DNSNameValue, parse_dnsname),
]

DATATYPES: dict[str, DataType] = {dt.id: dt for dt in _ALL}

# The legacy (XACML 1.0/2.0) duration ids denote the same value spaces as the XSD 1.1 ones.
_CANONICAL_ID = {
    LEGACY_DAYTIMEDURATION: DAYTIMEDURATION,
    LEGACY_YEARMONTHDURATION: YEARMONTHDURATION,
}

# Short names of the XACML JSON Profile (section 3.3.1) for the same data types.
JSON_SHORTHANDS: dict[str, str] = {
    "string": STRING, "boolean": BOOLEAN, "integer": INTEGER, "double": DOUBLE, "time": TIME,
    "date": DATE, "dateTime": DATETIME, "dayTimeDuration": DAYTIMEDURATION,
    "yearMonthDuration": YEARMONTHDURATION, "anyURI": ANYURI, "hexBinary": HEXBINARY,
    "base64Binary": BASE64BINARY, "rfc822Name": RFC822NAME, "x500Name": X500NAME,
    "ipAddress": IPADDRESS, "dnsName": DNSNAME, "xpathExpression": XPATHEXPRESSION,
}


def get_datatype(id: str) -> DataType:  # the XACML attribute is called Id
    """The data type with this URI; KeyError (naming the id) if it is not supported."""
    try:
        return DATATYPES[id]
    except KeyError:
        raise KeyError(f"unknown data type {id!r}") from None


def canonical_datatype_id(id: str) -> str:
    """Maps the legacy xquery-operators duration ids onto the XSD ones; others unchanged."""
    return _CANONICAL_ID.get(id, id)


def same_datatype(a: str, b: str) -> bool:
    """Whether two datatype URIs denote the same type (legacy duration ids included)."""
    return canonical_datatype_id(a) == canonical_datatype_id(b)
