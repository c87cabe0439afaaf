"""xs:date, xs:dateTime and xs:time: calendar arithmetic on the proleptic Gregorian calendar,
the value classes (compared as instants; no timezone means implicit UTC) and their parsers."""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from functools import total_ordering

from pdp.datatypes.common import DEC, fail

# Calendar arithmetic on the proleptic Gregorian calendar, with astronomical year numbering
# (year 0 exists), valid for any integer year.

def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if _is_leap(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 (negative before)."""
    y = year - (1 if month <= 2 else 0)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
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
        fail(f"timezone {text} out of range (-14:00..+14:00)")
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
        fail("hour, minute or second out of range")
    return False


def _check_date(year: int, month: int, day: int) -> None:
    if not 1 <= month <= 12:
        fail(f"month {month} out of range")
    if not 1 <= day <= days_in_month(year, month):
        fail(f"day {day} out of range for {year}-{month:02d}")


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
        days = days_from_civil(self.year, self.month, self.day)
        return DEC.add(Decimal(days * 86400 + self.hour * 3600 + self.minute * 60), self.second)

    @property
    def instant(self) -> Decimal:
        """Seconds since 1970-01-01T00:00:00Z."""
        return DEC.subtract(self._local_seconds(), Decimal((self.tz or 0) * 60))

    @classmethod
    def from_local_seconds(cls, total: Decimal, tz: int | None) -> XSDateTime:
        days, rem = divmod(int(total // 1), 86400)
        frac = DEC.subtract(total, Decimal(int(total // 1)))
        year, month, day = civil_from_days(days)
        return cls(year, month, day, rem // 3600, rem % 3600 // 60,
                   DEC.add(Decimal(rem % 60), frac), tz)

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
        return days_from_civil(self.year, self.month, self.day) * 86400 - (self.tz or 0) * 60

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
        return DEC.add(Decimal(self.hour * 3600 + self.minute * 60), self.second)

    @property
    def instant(self) -> Decimal:
        return DEC.subtract(self.seconds_of_day, Decimal((self.tz or 0) * 60))

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


def parse_datetime(text: str) -> XSDateTime:
    if len(text) > _MAX_TEMPORAL_LEXICAL:
        fail("too long")
    m = _DATETIME_RE.fullmatch(text)
    if not m:
        fail("expected YYYY-MM-DDThh:mm:ss[.s][Z|(+|-)hh:mm]")
    year, month, day, hour, minute = (int(m.group(i)) for i in range(1, 6))
    sec = Decimal(m.group(6))
    tz = _parse_tz(m.group(7))
    _check_date(year, month, day)
    if _check_clock(hour, minute, sec):
        # 24:00:00 is the first instant of the next day.
        year, month, day = civil_from_days(days_from_civil(year, month, day) + 1)
        hour = 0
    return XSDateTime(year, month, day, hour, minute, sec, tz)


def parse_date(text: str) -> XSDate:
    if len(text) > _MAX_TEMPORAL_LEXICAL:
        fail("too long")
    m = _DATE_RE.fullmatch(text)
    if not m:
        fail("expected YYYY-MM-DD[Z|(+|-)hh:mm]")
    year, month, day = int(m.group(1)), int(m.group(2)), int(m.group(3))
    _check_date(year, month, day)
    return XSDate(year, month, day, _parse_tz(m.group(4)))


def parse_time(text: str) -> XSTime:
    if len(text) > _MAX_TEMPORAL_LEXICAL:
        fail("too long")
    m = _TIME_RE.fullmatch(text)
    if not m:
        fail("expected hh:mm:ss[.s][Z|(+|-)hh:mm]")
    hour, minute, sec = int(m.group(1)), int(m.group(2)), Decimal(m.group(3))
    tz = _parse_tz(m.group(4))
    if _check_clock(hour, minute, sec):
        hour = 0
    return XSTime(hour, minute, sec, tz)
