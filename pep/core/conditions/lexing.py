"""Condition text to tokens: numbers kept exact as written (ints and `Decimal`s), strings with
their escapes (lone surrogates refused), identifiers (qualified `stream.attribute` ones for a
join grant's condition), keywords, operators in all their spellings, placeholders. Columns are
1-based, for error messages."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pep.core.conditions.syntax import (
    MAX_INTEGER_DIGITS,
    PLACEHOLDER_CATEGORIES,
    PLACEHOLDER_RE,
    ConditionError,
    Placeholder,
)

_OP_SPELLINGS = {"<": "<", ">": ">", "<=": "<=", ">=": ">=", "=": "=", "==": "=", "!=": "!=",
                 "<>": "!=", "≤": "<=", "≥": ">=", "≠": "!="}
_PUNCTUATION = {"(": "LPAREN", ")": "RPAREN", ",": "COMMA", "[": "LBRACKET", "]": "RBRACKET"}

TokenValue = Any
"""A token's value, whose type its `kind` says (the parser reads it by kind): the text of an
IDENT, OP or STRING, the exact number of a NUMBER (`int` or `Decimal`), the `bool` of a BOOL,
the `Placeholder` of a PLACEHOLDER, the keyword's text otherwise."""


@dataclass(frozen=True)
class Token:
    kind: str  # IDENT NUMBER STRING BOOL AND OR NOT OP LPAREN RPAREN PLACEHOLDER EOF
    value: TokenValue
    pos: int  # 1-based column


# [0-9], never \d (every Unicode decimal digit: '٣' would read as 3)
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DIGITS = frozenset("0123456789")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `stream.attribute`, in conditions over two streams (a join grant's, `qualified_conjuncts`)
_QUALIFIED_IDENT_RE = re.compile(
    r"[A-Za-z_][A-Za-z0-9_-]*\.[A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = {"and": "AND", "or": "OR", "not": "NOT", "in": "IN"}
_OP_WORDS = {"dominated_by": "dominated_by", "dominates": "dominates"}
_FUNCTIONS = {"within_box": "WITHIN_BOX"}
# Spatial functions are recognised only when '(' follows, so that an attribute may still be
# called `distance`.
SPATIAL_FUNCTIONS = {"distance": "DISTANCE", "distance_to": "DISTANCE_TO",
                      "within_polygon": "WITHIN_POLYGON"}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}
_NON_FINITE = {"nan", "inf", "infinity"}


def tokenize(text: str, qualified: bool = False) -> list[Token]:
    tokens: list[Token] = []
    ident_re = _QUALIFIED_IDENT_RE if qualified else _IDENT_RE
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        pos = i + 1
        if ch in _PUNCTUATION:
            tokens.append(Token(_PUNCTUATION[ch], ch, pos))
            i += 1
            continue
        two = text[i:i + 2]
        if two in ("<=", ">=", "==", "!=", "<>"):
            tokens.append(Token("OP", _OP_SPELLINGS[two], pos))
            i += 2
            continue
        if ch in "<>=≤≥≠":
            tokens.append(Token("OP", _OP_SPELLINGS[ch], pos))
            i += 1
            continue
        if ch in "'\"":
            value, i = _lex_string(text, i)
            tokens.append(Token("STRING", value, pos))
            continue
        if ch == "{":
            m = PLACEHOLDER_RE.match(text, i)
            if not m:
                raise ConditionError(
                    "malformed placeholder; expected {category:attribute}", pos, text
                )
            category = m.group(1).lower()
            if category not in PLACEHOLDER_CATEGORIES:
                raise ConditionError(
                    f"unknown placeholder category {m.group(1)!r}; expected one of "
                    f"{', '.join(PLACEHOLDER_CATEGORIES)}", pos, text)
            tokens.append(Token("PLACEHOLDER", Placeholder(category, m.group(2), pos), pos))
            i = m.end()
            continue
        if ch in _DIGITS or (ch in "+-." and i + 1 < n and (text[i + 1] in _DIGITS
                                                            or text[i + 1] == ".")):
            m = _NUMBER_RE.match(text, i)
            if not m:
                raise ConditionError("malformed number", pos, text)
            lexeme = m.group(0)
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "_."):
                raise ConditionError(f"malformed number {text[i:end + 1]!r}", pos, text)
            tokens.append(Token("NUMBER", _number(lexeme, pos, text), pos))
            i = end
            continue
        m = ident_re.match(text, i)
        if m:
            word = m.group(0)
            low = word.lower()
            if low in _NON_FINITE:
                raise ConditionError(f"{word!r} is not allowed: NaN and infinity are not valid "
                                     "literals", pos, text)
            if low in _KEYWORDS:
                tokens.append(Token(_KEYWORDS[low], word, pos))
            elif low in _OP_WORDS:
                tokens.append(Token("OP", _OP_WORDS[low], pos))
            elif low in _FUNCTIONS:
                tokens.append(Token("FUNCTION", _FUNCTIONS[low], pos))
            elif low in ("true", "false"):
                tokens.append(Token("BOOL", low == "true", pos))
            else:
                tokens.append(Token("IDENT", word, pos))
            i = m.end()
            continue
        if two in ("&&", "||"):
            raise ConditionError(f"unexpected {two!r}; write AND / OR", pos, text)
        raise ConditionError(f"unexpected character {ch!r}", pos, text)
    tokens.append(Token("EOF", None, n + 1))
    return tokens


def _number(lexeme: str, pos: int, text: str) -> int | Decimal:
    """The literal's exact value: an int, or a Decimal when it has a fraction or an exponent
    (never a float: `9007199254740993.0` must stay that number for a long attribute). Numbers
    beyond the range of a double are refused, as no attribute could be compared with them."""
    if re.fullmatch(r"[+-]?[0-9]+", lexeme):
        # no int() of a long lexeme: past 4300 digits Python refuses with a ValueError of its own
        digits = lexeme.lstrip("+-").lstrip("0")
        if len(digits) <= MAX_INTEGER_DIGITS and math.isfinite(float(lexeme)):
            return int(lexeme)
    else:
        value = Decimal(lexeme)
        if math.isfinite(float(value)):
            return value
    shown = lexeme if len(lexeme) <= 40 else f"{lexeme[:20]}..."
    raise ConditionError(f"number {shown} is not finite (beyond the range of a double)",
                         pos, text)


def _is_surrogate(ch: str) -> bool:
    return "\ud800" <= ch <= "\udfff"


def _lone_surrogate(ch: str, pos: int, text: str) -> ConditionError:
    return ConditionError(f"string has a lone UTF-16 surrogate U+{ord(ch):04X}, which is not a "
                          "character (write the character itself, or a \\u escape pair for "
                          "one beyond U+FFFF)", pos, text)


def _lex_string(text: str, start: int) -> tuple[str, int]:
    quote = text[start]
    out: list[str] = []
    i = start + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch == "\\":
            if i + 1 >= n:
                break
            esc = text[i + 1]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
                i += 2
                continue
            if esc == "u":
                code = _hex4(text, i + 2)
                if code is None:
                    raise ConditionError("malformed \\u escape; expected four hex digits", i + 1,
                                         text)
                if 0xD800 <= code <= 0xDBFF and text[i + 6:i + 8] == "\\u":
                    low = _hex4(text, i + 8)
                    if low is not None and 0xDC00 <= low <= 0xDFFF:  # a pair: one character
                        out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                        i += 12
                        continue
                if 0xD800 <= code <= 0xDFFF:
                    raise _lone_surrogate(chr(code), i + 1, text)
                out.append(chr(code))
                i += 6
                continue
            raise ConditionError(f"unknown escape \\{esc} in string", i + 1, text)
        if _is_surrogate(ch):
            raise _lone_surrogate(ch, i + 1, text)
        out.append(ch)
        i += 1
    raise ConditionError("unterminated string", start + 1, text)


def _hex4(text: str, at: int) -> int | None:
    digits = text[at:at + 4]
    if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return int(digits, 16)
    return None
