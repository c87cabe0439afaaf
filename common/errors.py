"""What a log line, a health report or an answer may say of a failure: its kind, never its text.

Spark's error messages quote data: a failed cast says "The value 'secret-123' of the type
"STRING" cannot be cast to "INT"", a failed Python step on the workers carries the worker's
traceback (with whatever its exception said of the row), py4j's error repeats the JVM's, and
Python's own exceptions do the same (`KeyError('secret-123')`, `ValueError(f"bad {value}")`). A
policy's hidden values must reach no log line, so an error that may come from a query is said by
its kinds only (`described`): the exception's class, Spark's error condition, the JVM's class,
each only when it is a plain identifier (code names it, data cannot). Where a line needs the
place in our code, `frames` gives the file, line and function of each Python frame: code, never
a message. The handler every program logs through (`common/logs.py`) applies the same rule to a
line that still passes an exception (`log.exception`, `exc_info`, an exception as an argument):
`SafeExceptions`.
"""
from __future__ import annotations

import logging
import re
import traceback
from types import TracebackType

# a dotted identifier: an exception's class, Spark's condition (CAST_INVALID_INPUT,
# FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH), a Java class name
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*(\.[A-Za-z_$][A-Za-z0-9_$]*)*")
_MAX_NAME = 200
MAX_FRAMES = 12  # the innermost frames said of an exception (`frames`)


def _plain(name: object) -> str | None:
    return name if isinstance(name, str) and len(name) <= _MAX_NAME \
        and _NAME.fullmatch(name) else None


def _condition(exc: BaseException) -> str | None:
    """Spark's error condition (`getCondition()` of pyspark.errors), when it has one."""
    condition = getattr(exc, "getCondition", None)
    if not callable(condition):
        return None
    try:
        return _plain(condition())
    except Exception:  # noqa: BLE001 - no condition then
        return None


def _java_class(exc: BaseException) -> str | None:
    """The JVM exception's class of a py4j error (`java_exception`) or of a PySpark error made
    of one (`_origin`)."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    if java is None:
        return None
    try:
        return _plain(java.getClass().getName())
    except Exception:  # noqa: BLE001 - the JVM gone: no class then
        return None


def described(exc: BaseException) -> str:
    """What may be said of `exc` anywhere (a log line, a health report, an answer, a handle's
    end): its class, Spark's error condition and, for an error of the JVM, its Java class, each
    only when it is a plain name. Never the message: Spark, py4j and the Python workers quote
    rows' values in it."""
    parts = [_plain(type(exc).__name__) or "Exception"]
    for name in (_condition(exc), _java_class(exc)):
        if name is not None and name not in parts:
            parts.append(name)
    return ", ".join(parts)


def frames(tb: TracebackType | None, limit: int = MAX_FRAMES) -> str:
    """Where an exception was raised, innermost first ("a.py:3 in f < b.py:9 in g"): file, line
    and function of each Python frame of `tb`, at most `limit` (the innermost). Code only: no
    source line (a line can hold a literal), no message, no chained exception."""
    walked = [(frame.f_code.co_filename, line, frame.f_code.co_name)
              for frame, line in traceback.walk_tb(tb)][-limit:]
    return " < ".join(f"{_short(file)}:{line} in {name}" for file, line, name in reversed(walked))


def _short(filename: str) -> str:
    """A frame's file from the package it belongs to (`pep/runtime/query/lifecycle.py`), or its
    last two parts for a library's."""
    parts = filename.replace("\\", "/").split("/")
    for root in ("pep", "pdp", "common", "proxy", "server", "pyspark", "py4j"):
        if root in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(root):])
    return "/".join(parts[-2:])


class SafeExceptions(logging.Filter):
    """On the handler every program writes through (`common.logs.configure_logging`): a record
    that carries an exception (`log.exception`, `exc_info=`) is written with `described` and the
    exception's frames in its place, and an exception passed as an argument (`log.warning("...:
    %s", exc)`) is written as `described`. The last guard, for a line of ours or a library's
    (py4j logs the callbacks' errors) that would otherwise print a message: each line of ours
    says what failed, and this makes sure the exception's text never follows it. An exception
    logged as the message itself (`log.error(exc)`) is written as `described` too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, BaseException):  # `log.error(exc)`
            record.msg = described(record.msg)
        info = record.exc_info
        if info and info[1] is not None:
            exc = info[1]
            where = frames(info[2])
            record.msg = f"{record.msg} [{described(exc)}{'; at ' + where if where else ''}]"
        if info or record.exc_text:
            record.exc_info, record.exc_text = None, None
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, BaseException) for a in args):
            record.args = tuple(described(a) if isinstance(a, BaseException) else a
                                for a in args)
        elif isinstance(args, dict) and any(isinstance(a, BaseException)
                                            for a in args.values()):
            record.args = {k: described(a) if isinstance(a, BaseException) else a
                           for k, a in args.items()}
        return True


__all__ = ["MAX_FRAMES", "SafeExceptions", "described", "frames"]
