"""Records an owner appends to an `ingest` stream: parsed and checked against the schema.

Every line of a batch is checked before anything is written (the catalogue writes all or
nothing); every error names the line (1-based, blank lines counted) and, when known, the field.

Numbers are read exactly: a JSON integer is a Python int whatever its size (a long must fit in
64 bits, or the line is refused), a number with a fraction or an exponent a `Decimal`, turned
into a double only for a double field. So a long such as 9007199254740993 reaches the ingest
file, Spark's LongType column and the readers' JSON as that integer, never through a float; and
epoch seconds of a timestamp become microseconds exactly (rounded half-even to the microsecond,
the precision of Spark's timestamps).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import NoReturn

from common.numbers import END_EPOCH_SECONDS, INT64_MAX, INT64_MIN, MIN_EPOCH_SECONDS
from pep.core.errors import InputTooLarge, InvalidInput
from pep.core.exact import (
    END_MICROS,
    MIN_MICROS,
    iso_from_micros,
    micros_from_seconds,
    round_half_even,
)
from pep.core.jsontypes import JsonObject, JsonValue
from pep.core.labels import LabelError
from pep.core.plan import Scalar, StreamSchema
from pep.core.punctuations import PUNCTUATION_KEY
from pep.streams.definition import StreamError

DEFAULT_MAX_LINES = 100_000
MAX_STRING_CHARS = 65_536
LONG_MIN, LONG_MAX = INT64_MIN, INT64_MAX

# A record as checked against its stream's schema and written to the ingest file: every
# attribute by the schema's spelling, a value of its type or null.
CheckedRecord = dict[str, Scalar | None]


class RecordError(StreamError, InvalidInput):
    """A batch of records was rejected; names the line (1-based) and, when known, the field."""

    def __init__(self, message: str, line: int | None = None, field: str | None = None) -> None:
        where = ", ".join(p for p in (f"line {line}" if line else "",
                                      f"field {field!r}" if field else "") if p)
        super().__init__(f"{where}: {message}" if where else message, line=line, field=field)
        self.line = line
        self.field = field
        self.detail = message


class BatchTooLarge(InputTooLarge, RecordError):
    """A batch over the size or line limits: a record error, but first of all too large (the
    first base decides the status the HTTP edge finds in its MRO: 413, not 400)."""


class _BadJson(ValueError):
    pass


def _reject_constant(name: str) -> NoReturn:
    raise _BadJson(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, JsonValue]]) -> JsonObject:
    out: JsonObject = {}
    for k, v in pairs:
        if k in out:
            raise _BadJson(f"duplicate key {k!r}")
        out[k] = v
    return out


def _shown(value: JsonValue) -> str:
    """A number for a message, shortened (a JSON integer may have thousands of digits)."""
    text = str(value) if isinstance(value, Decimal) else repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


def _lone_surrogate(text: str) -> str | None:
    for ch in text:
        if "\ud800" <= ch <= "\udfff":
            return ch
    return None


def _type_name(value: JsonValue) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", Decimal: "number", str: "string",
            list: "array", dict: "object"}.get(type(value), type(value).__name__)


def normalise_timestamp(value: JsonValue) -> str:
    """ISO-8601 text or epoch seconds -> ISO-8601 UTC with microseconds (`...Z`), the one form
    the runtime reads. Naive text is taken as UTC."""
    if isinstance(value, bool):
        raise ValueError("expected an ISO-8601 timestamp or epoch seconds, found boolean")
    if isinstance(value, (int, float, Decimal)):
        # A JSON integer may have any number of digits: compare before converting anything
        # (math.isfinite and fromtimestamp raise OverflowError past 1.8e308).
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("timestamp must be finite")
        out_of_range = ValueError(f"epoch seconds {_shown(value)} out of range "
                                  "(years 1 to 9999)")
        if not MIN_EPOCH_SECONDS <= value < END_EPOCH_SECONDS:
            raise out_of_range
        micros = round_half_even(micros_from_seconds(value))  # exact, then to the microsecond
        if not MIN_MICROS <= micros < END_MICROS:  # rounded up to the year 10000
            raise out_of_range
        return iso_from_micros(micros)
    elif isinstance(value, str):
        if len(value) > 64:
            raise ValueError("timestamp text is too long")
        try:
            ts = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO-8601 timestamp") from None
        try:
            ts = (ts.replace(tzinfo=UTC) if ts.tzinfo is None
                  else ts.astimezone(UTC))
        except OverflowError:  # 0001-01-01T00:00:00+01:00 is in year 0 in UTC
            raise ValueError(f"{value!r} is outside years 1 to 9999 in UTC") from None
    else:
        raise ValueError(f"expected an ISO-8601 timestamp or epoch seconds, "
                         f"found {_type_name(value)}")
    # isoformat, not strftime: "%Y" does not pad years before 1000 to four digits on glibc
    return ts.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _check_value(ftype: str, value: JsonValue) -> Scalar:
    """The value as written to the ingest file, or ValueError saying what is wrong."""
    if ftype == "double":
        if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
            raise ValueError(f"expected a number, found {_type_name(value)}")
        try:
            out = float(value)
        except OverflowError:
            raise ValueError("number out of range for a double") from None
        if not math.isfinite(out):
            raise ValueError("number out of range for a double")
        return out
    if ftype == "long":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, found {_type_name(value)}")
        if not LONG_MIN <= value <= LONG_MAX:
            raise ValueError("integer out of range for a 64-bit long")
        return value
    if ftype == "string":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, found {_type_name(value)}")
        if len(value) > MAX_STRING_CHARS:
            raise ValueError(f"string longer than {MAX_STRING_CHARS} characters")
        bad = _lone_surrogate(value)
        if bad is not None:  # a JSON escape such as "\ud800" without its pair: not text
            raise ValueError(f"string has a lone UTF-16 surrogate U+{ord(bad):04X}, which is "
                             "not a character")
        return value
    if ftype == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, found {_type_name(value)}")
        return value
    return normalise_timestamp(value)


def validate_records(schema: StreamSchema, body: bytes, time_attribute: str | None = None,
                     max_lines: int = DEFAULT_MAX_LINES,
                     optional: frozenset[str] = frozenset(),
                     punctuation: Callable[[JsonValue, int, int], None] | None = None
                     ) -> list[CheckedRecord]:
    """Parse and check JSON lines against the schema; raises RecordError at the first problem.

    Every field of the schema must be present in every record (field names match
    case-insensitively and are written with the schema's spelling), except those in `optional`
    (lower-cased names: attributes the owner added after registration, which producers written
    before may not know), written as `null` when left out. A value may be `null` (a sensor
    without a reading), except the event-time attribute, which orders the stream.
    Blank lines are skipped but counted, so line numbers match the client's file.
    A record whose only key is `$punctuation` is a security punctuation (`pep.core.punctuations`),
    not a record: `punctuation(value, line, n)` reads it (raising to refuse the batch), `n` the
    number of records before it; without a reader (the stream's punctuations are off) the batch
    is refused.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"not valid UTF-8 (byte {exc.start})",
                          line=body[: exc.start].count(b"\n") + 1) from None
    lines = text.split("\n")
    if len(lines) > max_lines + 1 or (len(lines) == max_lines + 1 and lines[-1].strip()):
        raise BatchTooLarge(f"more than {max_lines} lines in one batch")
    by_lower = {f.name.lower(): f for f in schema.fields}
    time_key = time_attribute.lower() if time_attribute else None
    records: list[CheckedRecord] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line, parse_constant=_reject_constant, parse_float=Decimal,
                             object_pairs_hook=_no_duplicates)
        except _BadJson as exc:
            raise RecordError(f"bad JSON: {exc}", line=number) from None
        except json.JSONDecodeError as exc:
            raise RecordError(f"bad JSON: {exc.msg} at column {exc.colno}", line=number) from None
        except (ValueError, RecursionError) as exc:
            raise RecordError(f"bad JSON: {str(exc)[:200]}", line=number) from None
        if not isinstance(obj, dict):
            raise RecordError(f"expected a JSON object, found {_type_name(obj)}", line=number)
        if PUNCTUATION_KEY in obj:
            if punctuation is None:
                raise RecordError("a security punctuation, but punctuations are off on this "
                                  "stream (its owner enables them at registration: source "
                                  "option punctuations=on)", line=number, field=PUNCTUATION_KEY)
            if len(obj) != 1:
                raise RecordError("a punctuation record holds nothing but its "
                                  f"{PUNCTUATION_KEY!r} key", line=number)
            punctuation(obj[PUNCTUATION_KEY], number, len(records))
            continue
        record: CheckedRecord = {}
        for key, value in obj.items():
            f = by_lower.get(key.lower())
            if f is None:
                raise RecordError("unknown field (not in the stream's schema)", line=number,
                                  field=key[:100])
            if f.name in record:
                raise RecordError("field given twice (names are case-insensitive)", line=number,
                                  field=f.name)
            if value is None:
                if f.name.lower() == time_key:
                    raise RecordError("the event-time attribute may not be null", line=number,
                                      field=f.name)
                record[f.name] = None
                continue
            try:
                if f.lattice is not None:  # a label: its canonical text (`pep.core.labels`)
                    record[f.name] = str(f.lattice.parse(value))
                else:
                    record[f.name] = _check_value(f.type, value)
            except (ValueError, LabelError) as exc:
                raise RecordError(str(exc), line=number, field=f.name) from None
        for f in schema.fields:
            if f.name not in record:
                if f.name.lower() in optional:
                    record[f.name] = None
                    continue
                raise RecordError("missing required field", line=number, field=f.name)
        records.append(record)
    return records
