"""Date and time arithmetic with durations (A.3.7), under the 3.0 ids and the deprecated 1.0
ids (which are typed with the legacy xquery-operators duration URIs).

Adding months pins the day to the end of a shorter month (2004-01-31 + P1M = 2004-02-29), as
XML Schema's appendix E prescribes; the timezone of the date or dateTime is kept.
"""
from __future__ import annotations

from pdp import datatypes as dt
from pdp.functions.base import F1, F3, Param, register


def _dt_add_dtd(value: dt.XSDateTime, duration: dt.DayTimeDuration) -> dt.XSDateTime:
    return dt.datetime_add_daytime(value, duration)


def _dt_sub_dtd(value: dt.XSDateTime, duration: dt.DayTimeDuration) -> dt.XSDateTime:
    return dt.datetime_add_daytime(value, -duration)


def _dt_add_ymd(value: dt.XSDateTime, duration: dt.YearMonthDuration) -> dt.XSDateTime:
    return dt.datetime_add_yearmonth(value, duration)


def _dt_sub_ymd(value: dt.XSDateTime, duration: dt.YearMonthDuration) -> dt.XSDateTime:
    return dt.datetime_add_yearmonth(value, -duration)


def _date_add_ymd(value: dt.XSDate, duration: dt.YearMonthDuration) -> dt.XSDate:
    return dt.date_add_yearmonth(value, duration)


def _date_sub_ymd(value: dt.XSDate, duration: dt.YearMonthDuration) -> dt.XSDate:
    return dt.date_add_yearmonth(value, -duration)


for _prefix, _dtd, _ymd in ((F3, dt.DAYTIMEDURATION, dt.YEARMONTHDURATION),
                            (F1, dt.LEGACY_DAYTIMEDURATION, dt.LEGACY_YEARMONTHDURATION)):
    _DT, _DA = Param(dt.DATETIME), Param(dt.DATE)
    register(_prefix + "dateTime-add-dayTimeDuration", dt.DATETIME, (_DT, Param(_dtd)), _dt_add_dtd)
    register(_prefix + "dateTime-subtract-dayTimeDuration", dt.DATETIME, (_DT, Param(_dtd)),
             _dt_sub_dtd)
    register(_prefix + "dateTime-add-yearMonthDuration", dt.DATETIME, (_DT, Param(_ymd)),
             _dt_add_ymd)
    register(_prefix + "dateTime-subtract-yearMonthDuration", dt.DATETIME, (_DT, Param(_ymd)),
             _dt_sub_ymd)
    register(_prefix + "date-add-yearMonthDuration", dt.DATE, (_DA, Param(_ymd)), _date_add_ymd)
    register(_prefix + "date-subtract-yearMonthDuration", dt.DATE, (_DA, Param(_ymd)),
             _date_sub_ymd)
