"""XACML 3.0 data types: their identifiers, Python value classes, parsing and formatting.

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
values generically; every NaN this module produces is the single object `NAN`.

Implicit timezone: a date, time or dateTime written without a timezone is compared as if it
were in UTC (XPath leaves the implicit timezone to the implementation; a fixed one keeps
decisions reproducible across machines). The value remembers that it had no timezone, so it
is formatted back without one.

Lexical values of every type except string are trimmed of XML whitespace before parsing, as the
XML Schema whitespace facet `collapse` demands; strings are taken verbatim.
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from dataclasses import dataclass, field
from decimal import Context, Decimal, InvalidOperation
from functools import total_ordering
from typing import Any, Callable, NoReturn

from pdp.errors import ValueSyntaxError

XS = "http://www.w3.org/2001/XMLSchema#"
LEGACY_XQ = "http://www.w3.org/TR/2002/WD-xquery-operators-20020816#"

STRING = XS + "string"
BOOLEAN = XS + "boolean"
INTEGER = XS + "integer"
DOUBLE = XS + "double"
TIME = XS + "time"
DATE = XS + "date"
DATETIME = XS + "dateTime"
ANYURI = XS + "anyURI"
HEXBINARY = XS + "hexBinary"
BASE64BINARY = XS + "base64Binary"
DAYTIMEDURATION = XS + "dayTimeDuration"
YEARMONTHDURATION = XS + "yearMonthDuration"
LEGACY_DAYTIMEDURATION = LEGACY_XQ + "dayTimeDuration"
LEGACY_YEARMONTHDURATION = LEGACY_XQ + "yearMonthDuration"
X500NAME = "urn:oasis:names:tc:xacml:1.0:data-type:x500Name"
RFC822NAME = "urn:oasis:names:tc:xacml:1.0:data-type:rfc822Name"
IPADDRESS = "urn:oasis:names:tc:xacml:2.0:data-type:ipAddress"
DNSNAME = "urn:oasis:names:tc:xacml:2.0:data-type:dnsName"
XPATHEXPRESSION = "urn:oasis:names:tc:xacml:3.0:data-type:xpathExpression"

_XML_WS = " \t\r\n"
# Exact decimal arithmetic for seconds; wide enough for any year a policy could mention.
_DEC = Context(prec=200)


def _fail(why: str) -> NoReturn:
    raise ValueError(why)


# --------------------------------------------------------------------------------------------
# Calendar arithmetic on the proleptic Gregorian calendar, with astronomical year numbering
# (year 0 exists), valid for any integer year.

def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if _is_leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 (negative before)."""
    y = year - (1 if month <= 2 else 0)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (1 if month <= 2 else 0), month, day


_TZ_RE = r"(Z|[+-][0-9]{2}:[0-9]{2})?"
_YEAR_RE = r"(-?(?:[1-9][0-9]{4,}|[0-9]{4}))"
_SEC_RE = r"([0-9]{2}(?:\.[0-9]+)?)"
_DATE_RE = re.compile(_YEAR_RE + r"-([0-9]{2})-([0-9]{2})" + _TZ_RE)
_TIME_RE = re.compile(r"([0-9]{2}):([0-9]{2}):" + _SEC_RE + _TZ_RE)
_DATETIME_RE = re.compile(
    _YEAR_RE + r"-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):" + _SEC_RE + _TZ_RE)
_MAX_TEMPORAL_LEXICAL = 80


def _parse_tz(text: str | None) -> int | None:
    """Timezone offset in minutes, or None when absent."""
    if not text:
        return None
    if text == "Z":
        return 0
    hours, minutes = int(text[1:3]), int(text[4:6])
    if minutes > 59 or hours > 14 or (hours == 14 and minutes):
        _fail(f"timezone {text} out of range (-14:00..+14:00)")
    offset = hours * 60 + minutes
    return -offset if text[0] == "-" else offset


def _format_tz(tz: int | None) -> str:
    if tz is None:
        return ""
    if tz == 0:
        return "Z"
    sign = "-" if tz < 0 else "+"
    return f"{sign}{abs(tz) // 60:02d}:{abs(tz) % 60:02d}"


def _format_seconds(sec: Decimal) -> str:
    whole = int(sec)
    frac = sec - whole
    if frac == 0:
        return f"{whole:02d}"
    digits = format(frac.normalize(), "f")  # "0.5"
    return f"{whole:02d}{digits[1:]}"


def _format_year(year: int) -> str:
    return f"-{abs(year):04d}" if year < 0 else f"{year:04d}"


def _check_clock(hour: int, minute: int, sec: Decimal) -> bool:
    """Validates a clock time; returns True when it is the end-of-day form 24:00:00."""
    if hour == 24 and minute == 0 and sec == 0:
        return True
    if hour > 23 or minute > 59 or sec >= 60:
        _fail("hour, minute or second out of range")
    return False


def _check_date(year: int, month: int, day: int) -> None:
    if not 1 <= month <= 12:
        _fail(f"month {month} out of range")
    if not 1 <= day <= _days_in_month(year, month):
        _fail(f"day {day} out of range for {year}-{month:02d}")


@total_ordering
@dataclass(frozen=True, eq=False)
class XSDateTime:
    """An xs:dateTime; compared as an instant (no timezone -> implicit UTC)."""

    year: int
    month: int
    day: int
    hour: int
    minute: int
    second: Decimal
    tz: int | None = None  # offset in minutes east of UTC

    def _local_seconds(self) -> Decimal:
        days = _days_from_civil(self.year, self.month, self.day)
        return _DEC.add(Decimal(days * 86400 + self.hour * 3600 + self.minute * 60), self.second)

    @property
    def instant(self) -> Decimal:
        """Seconds since 1970-01-01T00:00:00Z."""
        return _DEC.subtract(self._local_seconds(), Decimal((self.tz or 0) * 60))

    @classmethod
    def from_local_seconds(cls, total: Decimal, tz: int | None) -> "XSDateTime":
        days, rem = divmod(int(total // 1), 86400)
        frac = _DEC.subtract(total, Decimal(int(total // 1)))
        year, month, day = _civil_from_days(days)
        return cls(year, month, day, rem // 3600, rem % 3600 // 60,
                   _DEC.add(Decimal(rem % 60), frac), tz)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, XSDateTime):
            return NotImplemented
        return self.instant == other.instant

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, XSDateTime):
            return NotImplemented
        return self.instant < other.instant

    def __hash__(self) -> int:
        return hash(("dateTime", self.instant))

    def __str__(self) -> str:
        return (f"{_format_year(self.year)}-{self.month:02d}-{self.day:02d}T{self.hour:02d}:"
                f"{self.minute:02d}:{_format_seconds(self.second)}{_format_tz(self.tz)}")


@total_ordering
@dataclass(frozen=True, eq=False)
class XSDate:
    """An xs:date; compared by the instant its day starts (no timezone -> implicit UTC)."""

    year: int
    month: int
    day: int
    tz: int | None = None

    @property
    def instant(self) -> int:
        return _days_from_civil(self.year, self.month, self.day) * 86400 - (self.tz or 0) * 60

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, XSDate):
            return NotImplemented
        return self.instant == other.instant

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, XSDate):
            return NotImplemented
        return self.instant < other.instant

    def __hash__(self) -> int:
        return hash(("date", self.instant))

    def __str__(self) -> str:
        return f"{_format_year(self.year)}-{self.month:02d}-{self.day:02d}{_format_tz(self.tz)}"


@total_ordering
@dataclass(frozen=True, eq=False)
class XSTime:
    """An xs:time; compared as a dateTime on a fixed reference day, as XPath does.

    So 23:00:00-05:00 is later than 01:00:00Z (it is 04:00Z of the next day), and two times
    are equal only when they denote the same instant of that reference day.
    """

    hour: int
    minute: int
    second: Decimal
    tz: int | None = None

    @property
    def seconds_of_day(self) -> Decimal:
        return _DEC.add(Decimal(self.hour * 3600 + self.minute * 60), self.second)

    @property
    def instant(self) -> Decimal:
        return _DEC.subtract(self.seconds_of_day, Decimal((self.tz or 0) * 60))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, XSTime):
            return NotImplemented
        return self.instant == other.instant

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, XSTime):
            return NotImplemented
        return self.instant < other.instant

    def __hash__(self) -> int:
        return hash(("time", self.instant))

    def __str__(self) -> str:
        return (f"{self.hour:02d}:{self.minute:02d}:{_format_seconds(self.second)}"
                f"{_format_tz(self.tz)}")


def _parse_datetime(text: str) -> XSDateTime:
    if len(text) > _MAX_TEMPORAL_LEXICAL:
        _fail("too long")
    m = _DATETIME_RE.fullmatch(text)
    if not m:
        _fail("expected YYYY-MM-DDThh:mm:ss[.s][Z|(+|-)hh:mm]")
    year, month, day, hour, minute = (int(m.group(i)) for i in range(1, 6))
    sec = Decimal(m.group(6))
    tz = _parse_tz(m.group(7))
    _check_date(year, month, day)
    if _check_clock(hour, minute, sec):
        # 24:00:00 is the first instant of the next day.
        year, month, day = _civil_from_days(_days_from_civil(year, month, day) + 1)
        hour = 0
    return XSDateTime(year, month, day, hour, minute, sec, tz)


def _parse_date(text: str) -> XSDate:
    if len(text) > _MAX_TEMPORAL_LEXICAL:
        _fail("too long")
    m = _DATE_RE.fullmatch(text)
    if not m:
        _fail("expected YYYY-MM-DD[Z|(+|-)hh:mm]")
    year, month, day = int(m.group(1)), int(m.group(2)), int(m.group(3))
    _check_date(year, month, day)
    return XSDate(year, month, day, _parse_tz(m.group(4)))


def _parse_time(text: str) -> XSTime:
    if len(text) > _MAX_TEMPORAL_LEXICAL:
        _fail("too long")
    m = _TIME_RE.fullmatch(text)
    if not m:
        _fail("expected hh:mm:ss[.s][Z|(+|-)hh:mm]")
    hour, minute, sec = int(m.group(1)), int(m.group(2)), Decimal(m.group(3))
    tz = _parse_tz(m.group(4))
    if _check_clock(hour, minute, sec):
        hour = 0
    return XSTime(hour, minute, sec, tz)


# --------------------------------------------------------------------------------------------
# Durations

@total_ordering
@dataclass(frozen=True)
class DayTimeDuration:
    """An xs:dayTimeDuration as a signed, exact number of seconds."""

    seconds: Decimal

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, DayTimeDuration):
            return NotImplemented
        return self.seconds < other.seconds

    def __neg__(self) -> "DayTimeDuration":
        return DayTimeDuration(-self.seconds)

    def __str__(self) -> str:
        total = abs(self.seconds)
        if total == 0:
            return "PT0S"
        whole = int(total)
        frac = _DEC.subtract(total, Decimal(whole))
        days, rem = divmod(whole, 86400)
        hours, rem = divmod(rem, 3600)
        minutes, secs = divmod(rem, 60)
        out = "-P" if self.seconds < 0 else "P"
        if days:
            out += f"{days}D"
        if hours or minutes or secs or frac:
            out += "T"
            if hours:
                out += f"{hours}H"
            if minutes:
                out += f"{minutes}M"
            if secs or frac:
                out += str(secs) if not frac else format(_DEC.add(Decimal(secs), frac).normalize(), "f")
                out += "S"
        return out


@total_ordering
@dataclass(frozen=True)
class YearMonthDuration:
    """An xs:yearMonthDuration as a signed number of months."""

    months: int

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, YearMonthDuration):
            return NotImplemented
        return self.months < other.months

    def __neg__(self) -> "YearMonthDuration":
        return YearMonthDuration(-self.months)

    def __str__(self) -> str:
        total = abs(self.months)
        if total == 0:
            return "P0M"
        years, months = divmod(total, 12)
        out = "-P" if self.months < 0 else "P"
        if years:
            out += f"{years}Y"
        if months:
            out += f"{months}M"
        return out


_DTD_RE = re.compile(
    r"(-)?P(?:([0-9]+)D)?(?:T(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+(?:\.[0-9]*)?|\.[0-9]+)S)?)?")
_YMD_RE = re.compile(r"(-)?P(?:([0-9]+)Y)?(?:([0-9]+)M)?")
_MAX_DURATION_LEXICAL = 120


def _parse_daytime(text: str) -> DayTimeDuration:
    if len(text) > _MAX_DURATION_LEXICAL:
        _fail("too long")
    m = _DTD_RE.fullmatch(text)
    if not m or not any(m.group(i) for i in range(2, 6)) or text.endswith("T"):
        _fail("expected [-]PnDTnHnMn.nS with at least one component")
    days, hours, minutes = (int(m.group(i) or 0) for i in range(2, 5))
    secs = Decimal(m.group(5) or 0)
    total = _DEC.add(Decimal(days * 86400 + hours * 3600 + minutes * 60), secs)
    return DayTimeDuration(-total if m.group(1) else total)


def _parse_yearmonth(text: str) -> YearMonthDuration:
    if len(text) > _MAX_DURATION_LEXICAL:
        _fail("too long")
    m = _YMD_RE.fullmatch(text)
    if not m or not (m.group(2) or m.group(3)):
        _fail("expected [-]PnYnM with at least one component")
    total = int(m.group(2) or 0) * 12 + int(m.group(3) or 0)
    return YearMonthDuration(-total if m.group(1) else total)


def add_year_month(year: int, month: int, day: int, months: int) -> tuple[int, int, int]:
    """Adds months to a calendar date, pinning the day to the end of a shorter month (XSD E)."""
    index = year * 12 + (month - 1) + months
    new_year, new_month = divmod(index, 12)
    new_month += 1
    return new_year, new_month, min(day, _days_in_month(new_year, new_month))


def datetime_add_daytime(value: XSDateTime, duration: DayTimeDuration) -> XSDateTime:
    return XSDateTime.from_local_seconds(
        _DEC.add(value._local_seconds(), duration.seconds), value.tz)


def datetime_add_yearmonth(value: XSDateTime, duration: YearMonthDuration) -> XSDateTime:
    year, month, day = add_year_month(value.year, value.month, value.day, duration.months)
    return XSDateTime(year, month, day, value.hour, value.minute, value.second, value.tz)


def date_add_yearmonth(value: XSDate, duration: YearMonthDuration) -> XSDate:
    year, month, day = add_year_month(value.year, value.month, value.day, duration.months)
    return XSDate(year, month, day, value.tz)


# --------------------------------------------------------------------------------------------
# Names and addresses

_RDN_SEPARATORS = ",;"


def _split_unescaped(text: str, separators: str) -> list[str]:
    """Splits on separators that are neither backslash-escaped nor inside double quotes."""
    parts, current, i, quoted = [], [], 0, False
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch in separators and not quoted:
            parts.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    if quoted:
        _fail("unterminated quoted value")
    parts.append("".join(current))
    return parts


def _strip_dn_value(raw: str) -> str:
    """Strips insignificant spaces, keeping an escaped trailing space ("a\\ ")."""
    value = raw.lstrip()
    while value.endswith(" ") and not value.endswith("\\ "):
        value = value[:-1]
    return value


def _unescape_dn_value(raw: str) -> str:
    value = _strip_dn_value(raw)
    if value.startswith('"') and value.endswith('"') and len(value) >= 2:
        value = value[1:-1]
    out, i = bytearray(), 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            nxt = value[i + 1:i + 3]
            if len(nxt) == 2 and all(c in "0123456789abcdefABCDEF" for c in nxt):
                out += bytes.fromhex(nxt)
                i += 3
                continue
            if i + 1 >= len(value):
                _fail("dangling escape")
            out += value[i + 1].encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        _fail("escaped bytes are not UTF-8")


def _normalize_dn_value(value: str) -> str:
    # RFC 3280 4.1.2.4 / RFC 4518 string preparation, simplified: case-insensitive and
    # insignificant whitespace collapsed.
    return " ".join(value.split()).casefold()


_ATTR_TYPE_RE = re.compile(r"(?:[A-Za-z][A-Za-z0-9-]*|(?:oid\.|OID\.)?[0-9]+(?:\.[0-9]+)*)")


@dataclass(frozen=True)
class X500Name:
    """An X.500 distinguished name (RFC 2253 string form).

    `rdns` is the normalized comparison key: one tuple per RDN, most specific first (as
    written), each a sorted tuple of (attribute type, normalized value) pairs.
    """

    rdns: tuple[tuple[tuple[str, str], ...], ...]
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


def _parse_x500(text: str) -> X500Name:
    if not text:
        return X500Name((), text)
    rdns = []
    for rdn_text in _split_unescaped(text, _RDN_SEPARATORS):
        avas = []
        for ava in _split_unescaped(rdn_text, "+"):
            attr, sep, raw_value = ava.partition("=")
            attr = attr.strip()
            if not sep or not _ATTR_TYPE_RE.fullmatch(attr):
                _fail(f"bad attribute type and value {ava.strip()!r}")
            attr = attr.lower()
            if attr.startswith("oid."):
                attr = attr[4:]
            raw_value = _strip_dn_value(raw_value)
            if raw_value.startswith("#"):
                hexpart = raw_value[1:]
                if not hexpart or len(hexpart) % 2 or not re.fullmatch(r"[0-9A-Fa-f]+", hexpart):
                    _fail(f"bad hex value {raw_value!r}")
                value = "#" + hexpart.lower()
            else:
                value = _normalize_dn_value(_unescape_dn_value(raw_value))
            avas.append((attr, value))
        rdns.append(tuple(sorted(avas)))
    return X500Name(tuple(rdns), text)


@dataclass(frozen=True)
class Rfc822Name:
    """An e-mail address: the local part is case-sensitive, the domain is not."""

    local: str
    domain: str  # lower-cased
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


_LOCAL_RE = re.compile(r'[^\s@]+|"[^"]*"')
_DOMAIN_RE = re.compile(r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?|\[[^\]\s]+\]")


def _parse_rfc822(text: str) -> Rfc822Name:
    local, sep, domain = text.rpartition("@")
    if not sep or not local or not domain:
        _fail("expected local-part@domain")
    if not _LOCAL_RE.fullmatch(local) or not _DOMAIN_RE.fullmatch(domain):
        _fail("bad local part or domain")
    return Rfc822Name(local, domain.lower(), text)


@dataclass(frozen=True)
class PortRange:
    """A port range; None for an open end ("-80" is 0..80 in effect, "8080-" is 8080..)."""

    low: int | None
    high: int | None

    def __str__(self) -> str:
        if self.low is not None and self.low == self.high:
            return str(self.low)
        return f"{'' if self.low is None else self.low}-{'' if self.high is None else self.high}"

    def contains(self, port: int) -> bool:
        return (self.low is None or port >= self.low) and (self.high is None or port <= self.high)


def _parse_port(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or int(text) > 65535:
        _fail(f"bad port number {text!r}")
    return int(text)


def _parse_portrange(text: str) -> PortRange:
    if "-" not in text:
        port = _parse_port(text)
        return PortRange(port, port)
    low_text, _, high_text = text.partition("-")
    if not low_text and not high_text:
        _fail("port range '-' has no bound")
    low = _parse_port(low_text) if low_text else None
    high = _parse_port(high_text) if high_text else None
    if low is not None and high is not None and low > high:
        _fail(f"port range {text} is empty")
    return PortRange(low, high)


@dataclass(frozen=True)
class IPAddressValue:
    """An XACML ipAddress: address, optional mask, optional port range."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    mask: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    ports: PortRange | None = None

    def __str__(self) -> str:
        v6 = self.address.version == 6
        out = f"[{self.address}]" if v6 else str(self.address)
        if self.mask is not None:
            out += f"/[{self.mask}]" if v6 else f"/{self.mask}"
        if self.ports is not None:
            out += f":{self.ports}"
        return out


def _parse_ipaddress(text: str) -> IPAddressValue:
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    mask: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        if text.startswith("["):
            end = text.find("]")
            if end < 0:
                _fail("unterminated [IPv6 address]")
            address = ipaddress.IPv6Address(text[1:end])
            rest = text[end + 1:]
            mask = None
            if rest.startswith("/"):
                if not rest.startswith("/["):
                    _fail("an IPv6 mask must be written in brackets")
                mend = rest.find("]")
                if mend < 0:
                    _fail("unterminated [IPv6 mask]")
                mask = ipaddress.IPv6Address(rest[2:mend])
                rest = rest[mend + 1:]
        else:
            addr_part, colon, port_text = text.partition(":")
            rest = colon + port_text
            addr_text, slash, mask_text = addr_part.partition("/")
            address = ipaddress.IPv4Address(addr_text)
            mask = ipaddress.IPv4Address(mask_text) if slash else None
    except ipaddress.AddressValueError as exc:
        _fail(str(exc))
    ports = None
    if rest:
        if not rest.startswith(":"):
            _fail(f"unexpected {rest!r} after the address")
        if rest[1:]:
            ports = _parse_portrange(rest[1:])
    return IPAddressValue(address, mask, ports)


_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DNS_RE = re.compile(rf"(?:\*\.)?(?:{_HOST_LABEL}\.)*{_HOST_LABEL}\.?|\*")


@dataclass(frozen=True, eq=False)
class DNSNameValue:
    """An XACML dnsName: host name (leading "*." wildcard allowed) and optional port range.

    Host names compare case-insensitively; the text keeps the case it was written in.
    """

    host: str
    ports: PortRange | None = None

    def _key(self) -> tuple[str, PortRange | None]:
        return self.host.lower(), self.ports

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DNSNameValue):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.host if self.ports is None else f"{self.host}:{self.ports}"


def _parse_dnsname(text: str) -> DNSNameValue:
    host, colon, port_text = text.partition(":")
    if len(host) > 253 or not _DNS_RE.fullmatch(host):
        _fail("bad host name")
    ports = _parse_portrange(port_text) if colon and port_text else None
    return DNSNameValue(host, ports)


# --------------------------------------------------------------------------------------------
# Simple types

_INTEGER_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?INF|NaN")
_MAX_INTEGER_DIGITS = 4000


def _parse_boolean(text: str) -> bool:
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    _fail("expected true, false, 1 or 0")


def _parse_integer(text: str) -> int:
    if not _INTEGER_RE.fullmatch(text):
        _fail("expected an optionally signed decimal integer")
    if len(text) > _MAX_INTEGER_DIGITS:
        _fail(f"more than {_MAX_INTEGER_DIGITS} digits")
    return int(text)


NAN = float("nan")


def _parse_double(text: str) -> float:
    if not _DOUBLE_RE.fullmatch(text):
        _fail("expected a decimal or scientific number, INF, -INF or NaN")
    if text.endswith("INF"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == "NaN":
        return NAN
    return float(text)


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def values_equal(a: Any, b: Any) -> bool:
    """XACML equality of two values of the same type (NaN equals NaN, see module doc)."""
    return a == b or (_is_nan(a) and _is_nan(b))


def equality_key(value: Any) -> Any:
    """A hashable key such that equal keys <=> XACML-equal values (every NaN maps to NAN)."""
    return NAN if _is_nan(value) else value


def format_double(value: float) -> str:
    """XACML lexical form of a double: INF, -INF, NaN, else the shortest round-trip decimal."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "INF" if value > 0 else "-INF"
    text = repr(float(value))
    if "e" in text:
        mantissa, exp = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}E{int(exp)}"
    return text


def _parse_hex(text: str) -> bytes:
    if len(text) % 2 or not re.fullmatch(r"[0-9A-Fa-f]*", text):
        _fail("expected an even number of hexadecimal digits")
    return bytes.fromhex(text)


def _parse_base64(text: str) -> bytes:
    compact = "".join(text.split())
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        _fail(f"bad base64 ({exc})")


def _parse_anyuri(text: str) -> str:
    if any(c in text for c in "\x00\n\r\t"):
        _fail("control characters are not allowed in a URI")
    return text


# --------------------------------------------------------------------------------------------
# The registry

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
        text = lexical.strip(_XML_WS) if self.trims_whitespace else lexical
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
    DataType(BOOLEAN, "boolean", bool, _parse_boolean, _fmt_bool),
    DataType(INTEGER, "integer", int, _parse_integer, str),
    DataType(DOUBLE, "double", float, _parse_double, format_double),
    DataType(TIME, "time", XSTime, _parse_time),
    DataType(DATE, "date", XSDate, _parse_date),
    DataType(DATETIME, "dateTime", XSDateTime, _parse_datetime),
    DataType(ANYURI, "anyURI", str, _parse_anyuri, str),
    DataType(HEXBINARY, "hexBinary", bytes, _parse_hex, lambda b: b.hex().upper()),
    DataType(BASE64BINARY, "base64Binary", bytes, _parse_base64, _fmt_b64),
    DataType(DAYTIMEDURATION, "dayTimeDuration", DayTimeDuration, _parse_daytime),
    DataType(YEARMONTHDURATION, "yearMonthDuration", YearMonthDuration, _parse_yearmonth),
    DataType(LEGACY_DAYTIMEDURATION, "dayTimeDuration", DayTimeDuration, _parse_daytime),
    DataType(LEGACY_YEARMONTHDURATION, "yearMonthDuration", YearMonthDuration, _parse_yearmonth),
    DataType(X500NAME, "x500Name", X500Name, _parse_x500),
    DataType(RFC822NAME, "rfc822Name", Rfc822Name, _parse_rfc822),
    DataType(IPADDRESS, "ipAddress", IPAddressValue, _parse_ipaddress),
    DataType(DNSNAME, "dnsName", DNSNameValue, _parse_dnsname),
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


def get_datatype(id: str) -> DataType:  # noqa: A002 - the XACML attribute is called Id
    """The data type with this URI; KeyError (naming the id) if it is not supported."""
    try:
        return DATATYPES[id]
    except KeyError:
        raise KeyError(f"unknown data type {id!r}") from None


def canonical_datatype_id(id: str) -> str:  # noqa: A002
    """Maps the legacy xquery-operators duration ids onto the XSD ones; others unchanged."""
    return _CANONICAL_ID.get(id, id)


def same_datatype(a: str, b: str) -> bool:
    """Whether two datatype URIs denote the same type (legacy duration ids included)."""
    return canonical_datatype_id(a) == canonical_datatype_id(b)
