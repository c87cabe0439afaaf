"""xs:dayTimeDuration and xs:yearMonthDuration: value classes, parsers, and the duration
arithmetic on dates and dateTimes that the XACML add/subtract functions use."""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from functools import total_ordering

from pdp.datatypes.common import DEC, fail
from pdp.datatypes.temporal import XSDate, XSDateTime, days_in_month


@total_ordering
@dataclass(frozen=True)
class DayTimeDuration:
    """An xs:dayTimeDuration as a signed, exact number of seconds."""

    seconds: Decimal

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, DayTimeDuration):
            return NotImplemented
        return self.seconds < other.seconds

    def __neg__(self) -> DayTimeDuration:
        return DayTimeDuration(-self.seconds)

    def __str__(self) -> str:
        total = abs(self.seconds)
        if total == 0:
            return "PT0S"
        whole = int(total)
        frac = DEC.subtract(total, Decimal(whole))
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
                out += (
                    str(secs) if not frac else format(DEC.add(Decimal(secs), frac).normalize(), "f")
                )
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

    def __neg__(self) -> YearMonthDuration:
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


def parse_daytime(text: str) -> DayTimeDuration:
    if len(text) > _MAX_DURATION_LEXICAL:
        fail("too long")
    m = _DTD_RE.fullmatch(text)
    if not m or not any(m.group(i) for i in range(2, 6)) or text.endswith("T"):
        fail("expected [-]PnDTnHnMn.nS with at least one component")
    days, hours, minutes = (int(m.group(i) or 0) for i in range(2, 5))
    secs = Decimal(m.group(5) or 0)
    total = DEC.add(Decimal(days * 86400 + hours * 3600 + minutes * 60), secs)
    return DayTimeDuration(-total if m.group(1) else total)


def parse_yearmonth(text: str) -> YearMonthDuration:
    if len(text) > _MAX_DURATION_LEXICAL:
        fail("too long")
    m = _YMD_RE.fullmatch(text)
    if not m or not (m.group(2) or m.group(3)):
        fail("expected [-]PnYnM with at least one component")
    total = int(m.group(2) or 0) * 12 + int(m.group(3) or 0)
    return YearMonthDuration(-total if m.group(1) else total)


def add_year_month(year: int, month: int, day: int, months: int) -> tuple[int, int, int]:
    """Adds months to a calendar date, pinning the day to the end of a shorter month (XSD E)."""
    index = year * 12 + (month - 1) + months
    new_year, new_month = divmod(index, 12)
    new_month += 1
    return new_year, new_month, min(day, days_in_month(new_year, new_month))


def datetime_add_daytime(value: XSDateTime, duration: DayTimeDuration) -> XSDateTime:
    return XSDateTime.from_local_seconds(
        DEC.add(value._local_seconds(), duration.seconds), value.tz)


def datetime_add_yearmonth(value: XSDateTime, duration: YearMonthDuration) -> XSDateTime:
    year, month, day = add_year_month(value.year, value.month, value.day, duration.months)
    return XSDateTime(year, month, day, value.hour, value.minute, value.second, value.tz)


def date_add_yearmonth(value: XSDate, duration: YearMonthDuration) -> XSDate:
    year, month, day = add_year_month(value.year, value.month, value.day, duration.months)
    return XSDate(year, month, day, value.tz)
