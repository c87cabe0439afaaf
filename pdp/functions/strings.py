"""String functions (A.3.3 and A.3.9): normalization, concatenation, prefix/suffix/containment
tests and substrings, for strings and anyURIs.

Positions count Unicode code points. Results longer than MAX_STRING_CHARS are refused
(Indeterminate), so a policy cannot build a huge string by nesting concatenations.
"""
from __future__ import annotations

from collections.abc import Callable

from pdp import datatypes as dt
from pdp.functions.base import F1, F2, F3, MAX_STRING_CHARS, Param, fail, register

_S, _U, _I = Param(dt.STRING), Param(dt.ANYURI), Param(dt.INTEGER)
_XML_WS = " \t\r\n"


def _bounded(function_id: str, parts: tuple[str, ...]) -> str:
    if sum(len(p) for p in parts) > MAX_STRING_CHARS:
        raise fail(function_id, f"result longer than {MAX_STRING_CHARS} characters")
    return "".join(parts)


def _normalize_space(value: str) -> str:
    return value.strip(_XML_WS)


def _to_lower_case(value: str) -> str:
    return value.lower()


def _concatenate(*parts: str) -> str:
    return _bounded(F2 + "string-concatenate", parts)


def _uri_concatenate(uri: str, *parts: str) -> str:
    return _bounded(F2 + "uri-string-concatenate", (uri,) + parts)


def _starts_with(prefix: str, value: str) -> bool:
    """True if the second argument begins with the first."""
    return value.startswith(prefix)


def _ends_with(suffix: str, value: str) -> bool:
    return value.endswith(suffix)


def _contains(part: str, value: str) -> bool:
    return part in value


def _substring(function_id: str) -> Callable[[str, int, int], str]:
    def substring(value: str, begin: int, end: int) -> str:
        """Characters from `begin` (0-based) up to, not including, `end`; end -1: to the end."""
        length = len(value)
        if begin < 0 or begin > length:
            raise fail(function_id, f"begin index {begin} outside 0..{length}")
        if end == -1:
            end = length
        if end < begin or end > length:
            raise fail(function_id, f"end index {end} outside {begin}..{length} (or -1)")
        return value[begin:end]
    return substring


register(F1 + "string-normalize-space", dt.STRING, (_S,), _normalize_space)
register(F1 + "string-normalize-to-lower-case", dt.STRING, (_S,), _to_lower_case)
register(F2 + "string-concatenate", dt.STRING, (_S,), _concatenate, variadic=True, min_args=2)
# Deprecated in 3.0 but still accepted.
register(F2 + "uri-string-concatenate", dt.ANYURI, (_U, _S), _uri_concatenate, variadic=True,
         min_args=2)
register(F3 + "string-starts-with", dt.BOOLEAN, (_S, _S), _starts_with)
register(F3 + "anyURI-starts-with", dt.BOOLEAN, (_S, _U), _starts_with)
register(F3 + "string-ends-with", dt.BOOLEAN, (_S, _S), _ends_with)
register(F3 + "anyURI-ends-with", dt.BOOLEAN, (_S, _U), _ends_with)
register(F3 + "string-contains", dt.BOOLEAN, (_S, _S), _contains)
register(F3 + "anyURI-contains", dt.BOOLEAN, (_S, _U), _contains)
register(F3 + "string-substring", dt.STRING, (_S, _I, _I), _substring(F3 + "string-substring"))
register(F3 + "anyURI-substring", dt.STRING, (_U, _I, _I), _substring(F3 + "anyURI-substring"))
