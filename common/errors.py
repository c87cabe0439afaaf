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
line that still passes such an exception (`log.exception`, `exc_info`, an exception as an
argument): `SafeExceptions`.
"""
from __future__ import annotations

import logging
import re
import traceback
from types import TracebackType
from typing import TypeGuard

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


# Where an exception may carry a row: the libraries a query's errors come from (their classes'
# top package), and the loggers of the code that runs queries and handles their rows
QUERY_LIBRARIES = ("pyspark", "py4j", "pyarrow")
QUERY_LOGGERS = ("pep.runtime", "py4j", "pyspark")


def from_a_query(exc: BaseException) -> bool:
    """`exc`, or an exception it was raised from or while handling, is Spark's, py4j's or
    Arrow's (a PythonException of the workers is PySpark's)."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if type(current).__module__.split(".")[0] in QUERY_LIBRARIES:
            return True
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


class SafeExceptions(logging.Filter):
    """On the handler every program writes through (`common.logs.configure_logging`): the last
    guard, for a line of ours or a library's that passes an exception which may carry a row (one
    `from_a_query`, or any on a logger of the code that runs queries, `QUERY_LOGGERS`; py4j logs
    the callbacks' errors). A record that carries it (`log.exception`, `exc_info=`) is written
    with `described` and the exception's frames in its place; passed as an argument
    (`log.warning("...: %s", exc)`) or as the message (`log.error(exc)`), as `described`. Each
    line of ours on a query's path says what failed by itself; this makes sure no exception's
    text follows it. Other exceptions (a configuration file's, an identity provider's) keep
    their text: it is the operator's, and says what to fix."""

    def filter(self, record: logging.LogRecord) -> bool:
        everything = any(record.name == name or record.name.startswith(name + ".")
                         for name in QUERY_LOGGERS)

        def scrubbed(value: object) -> TypeGuard[BaseException]:
            return isinstance(value, BaseException) and (everything or from_a_query(value))

        if scrubbed(record.msg):
            record.msg = described(record.msg)
        info = record.exc_info
        if info and info[1] is not None and scrubbed(info[1]):
            where = frames(info[2])
            record.msg = f"{record.msg} [{described(info[1])}{'; at ' + where if where else ''}]"
            record.exc_info, record.exc_text = None, None
        args = record.args
        if isinstance(args, tuple) and any(scrubbed(a) for a in args):
            record.args = tuple(described(a) if scrubbed(a) else a for a in args)
        elif isinstance(args, dict) and any(scrubbed(a) for a in args.values()):
            record.args = {k: described(a) if scrubbed(a) else a for k, a in args.items()}
        return True


__all__ = ["MAX_FRAMES", "QUERY_LIBRARIES", "QUERY_LOGGERS", "SafeExceptions", "described",
           "frames", "from_a_query"]
