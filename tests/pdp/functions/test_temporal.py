import pytest

from pdp import datatypes as dt
from pdp.functions import get_function
from tests.pdp.functions.helpers import call, v

F1 = "urn:oasis:names:tc:xacml:1.0:function:"


@pytest.mark.parametrize("name,start,duration,expected", [
    ("dateTime-add-dayTimeDuration", "2002-03-22T08:23:47-05:00", "P1DT16H",
     "2002-03-24T00:23:47-05:00"),
    ("dateTime-subtract-dayTimeDuration", "2002-03-01T00:00:00Z", "PT1S",
     "2002-02-28T23:59:59Z"),
    ("dateTime-add-dayTimeDuration", "2002-03-01T00:00:00Z", "-PT0.5S",
     "2002-02-28T23:59:59.5Z"),
    ("dateTime-add-yearMonthDuration", "2004-01-31T10:00:00", "P1M", "2004-02-29T10:00:00"),
    ("dateTime-subtract-yearMonthDuration", "2004-03-31T10:00:00Z", "P1Y1M",
     "2003-02-28T10:00:00Z"),
    ("date-add-yearMonthDuration", "2000-02-29", "P1Y", "2001-02-28"),
    ("date-subtract-yearMonthDuration", "2001-01-15+02:00", "P13M", "1999-12-15+02:00"),
])
def test_date_time_arithmetic(name, start, duration, expected):
    kind = "date" if name.startswith("date-") else "dateTime"
    dur_kind = "yearMonthDuration" if "yearMonth" in name else "dayTimeDuration"
    result = call(name, v(kind, start), v(dur_kind, duration))
    assert result == v(kind, expected)
    assert dt.get_datatype(dt.JSON_SHORTHANDS[kind]).format(result) == expected


def test_legacy_ids_exist_with_legacy_types_and_same_results():
    legacy = get_function(F1 + "dateTime-add-dayTimeDuration")
    assert legacy.params[1].type == dt.LEGACY_DAYTIMEDURATION
    start = v("dateTime", "2002-03-22T08:23:47Z")
    duration = dt.get_datatype(dt.LEGACY_DAYTIMEDURATION).parse("PT1H")
    assert legacy.impl(start, duration) == v("dateTime", "2002-03-22T09:23:47Z")
    for name in ("dateTime-subtract-dayTimeDuration", "dateTime-add-yearMonthDuration",
                 "dateTime-subtract-yearMonthDuration", "date-add-yearMonthDuration",
                 "date-subtract-yearMonthDuration", "dayTimeDuration-equal",
                 "yearMonthDuration-one-and-only"):
        assert get_function(F1 + name).id == F1 + name
