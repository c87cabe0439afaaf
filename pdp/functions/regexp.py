"""Regular-expression matching (A.3.13): T-regexp-match for string, anyURI, ipAddress,
dnsName, rfc822Name and x500Name.

XACML uses XPath `fn:matches`: XML Schema regex syntax plus ^/$ anchors, True when the pattern
matches *some part* of the value (anchor it with ^...$ to test the whole value). Non-string
values are matched in their lexical form (`DataType.format`). Patterns run on the linear-time
engine of `xsd_regex` (compiled once, cached), so a hostile pattern cannot stall a decision; an
invalid or unsupported pattern, a value longer than MAX_SUBJECT_CHARS, or a match that would
exceed the engine's work budget is Indeterminate.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdp import datatypes as dt
from pdp.functions.base import F1, F2, Param, fail, register
from pdp.functions.xsd_regex import RegexBudgetError, RegexSyntaxError, compile_xsd_regex

MAX_SUBJECT_CHARS = 64 * 1024

__all__ = ["RegexSyntaxError", "compile_xsd_regex", "MAX_SUBJECT_CHARS"]


def _regexp_match(function_id: str, as_text: Callable[[Any], str]) -> Callable[[str, Any], bool]:
    def regexp_match(pattern: str, value: Any) -> bool:
        try:
            compiled = compile_xsd_regex(pattern)
        except RegexSyntaxError as exc:
            raise fail(function_id, f"bad regular expression {pattern[:80]!r}: {exc}") from None
        subject = as_text(value)
        if len(subject) > MAX_SUBJECT_CHARS:
            raise fail(function_id, f"value longer than {MAX_SUBJECT_CHARS} characters")
        try:
            return compiled.search(subject)
        except RegexBudgetError as exc:
            raise fail(function_id, str(exc)) from None
    return regexp_match


_S = Param(dt.STRING)
for _prefix, _name, _type in (
    (F1, "string", dt.STRING),
    (F2, "anyURI", dt.ANYURI),
    (F2, "ipAddress", dt.IPADDRESS),
    (F2, "dnsName", dt.DNSNAME),
    (F2, "rfc822Name", dt.RFC822NAME),
    (F2, "x500Name", dt.X500NAME),
):
    _id = f"{_prefix}{_name}-regexp-match"
    register(_id, dt.BOOLEAN, (_S, Param(_type)), _regexp_match(_id, dt.get_datatype(_type).format))
