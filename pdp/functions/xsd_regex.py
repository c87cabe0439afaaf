"""A linear-time matcher for XML Schema / XPath regular expressions.

XACML's regexp-match functions take patterns from policies, and Python's `re` backtracks: a
pattern such as `(a|a)+b` takes exponential time on a short value. So patterns are parsed here
into a syntax tree, compiled to a Thompson NFA and run as a lazily built DFA (as RE2 does):
the time is linear in the value's length whatever the pattern, and the DFA states met are
cached per pattern, so repeated matches cost one dict lookup per character.

Semantics are those of XPath `fn:matches` without flags: the result is True when the pattern
matches *some part* of the value; `^` and `$` anchor at the start and the very end; `.`
matches anything but CR and LF; `\\s` is the four XML whitespace characters; `\\i`/`\\c` are
XML name characters; `\\p{..}` supports the general categories and common blocks; `[a-z-[aeiou]]`
subtracts classes; reluctant quantifiers are accepted (they do not change whether a pattern
matches). Not supported, and reported as errors: back-references (they cannot be matched in
linear time), `\\P{..}`/`\\I`/`\\C` inside a class, unknown blocks. Known approximation: `\\w` is
Python's word characters without `_` (XSD also counts symbols such as `+` as word characters).

Every single-character atom (literal, class, escape) is kept as a small Python pattern that
matches exactly one character; only those are run by `re`, so they cannot backtrack.
"""
from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

MAX_PATTERN_CHARS = 2048
MAX_REPEAT = 1000
MAX_NFA_STATES = 5_000
MAX_CACHED_TRANSITIONS = 20_000
# NFA states visited while building new DFA states during one search (about a second of
# work): a pattern whose DFA explodes, like (a|b)*a(a|b){500}, cannot stall a decision.
MAX_SEARCH_WORK = 1_000_000


class RegexSyntaxError(ValueError):
    """The pattern is not valid (or not supported) XML Schema / XPath regex syntax."""


class RegexBudgetError(ValueError):
    """Matching this pattern against this value would take too long; the caller decides."""


_SINGLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t"}
_META = set("\\|.?*+(){}-[]^$")

_NAME_START = (
    "A-Z_:a-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d"
    "\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd"
)
_NAME_CHAR = _NAME_START + r"\-.0-9\u00b7\u0300-\u036f\u203f-\u2040"

_BLOCKS = {
    "BasicLatin": (0x0000, 0x007F),
    "Latin-1Supplement": (0x0080, 0x00FF),
    "LatinExtended-A": (0x0100, 0x017F),
    "LatinExtended-B": (0x0180, 0x024F),
    "IPAExtensions": (0x0250, 0x02AF),
    "Greek": (0x0370, 0x03FF),
    "GreekandCoptic": (0x0370, 0x03FF),
    "Cyrillic": (0x0400, 0x04FF),
    "Armenian": (0x0530, 0x058F),
    "Hebrew": (0x0590, 0x05FF),
    "Arabic": (0x0600, 0x06FF),
    "Devanagari": (0x0900, 0x097F),
    "Thai": (0x0E00, 0x0E7F),
    "Hangul Jamo": (0x1100, 0x11FF),
    "LatinExtendedAdditional": (0x1E00, 0x1EFF),
    "GreekExtended": (0x1F00, 0x1FFF),
    "GeneralPunctuation": (0x2000, 0x206F),
    "CurrencySymbols": (0x20A0, 0x20CF),
    "Arrows": (0x2190, 0x21FF),
    "MathematicalOperators": (0x2200, 0x22FF),
    "Hiragana": (0x3040, 0x309F),
    "Katakana": (0x30A0, 0x30FF),
    "CJKUnifiedIdeographs": (0x4E00, 0x9FFF),
    "HangulSyllables": (0xAC00, 0xD7AF),
}


def _class_char(code: int) -> str:
    ch = chr(code)
    return "\\" + ch if ch in "\\]-[^" else ch


def _ranges_to_class(ranges: list[tuple[int, int]]) -> str:
    return "".join(_class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}"
                   for a, b in ranges)


@lru_cache(maxsize=1)
def _category_ranges() -> dict[str, list[tuple[int, int]]]:
    """Code-point ranges of every general category, built once on first use of \\p{..}."""
    table: dict[str, list[tuple[int, int]]] = {}
    current: str | None
    start, current = 0, unicodedata.category(chr(0))
    for code in range(1, sys.maxunicode + 2):
        cat = unicodedata.category(chr(code)) if code <= sys.maxunicode else None
        if cat != current:
            table.setdefault(current or "", []).append((start, code - 1))
            start, current = code, cat
    return table


@lru_cache(maxsize=64)
def _property_class(name: str) -> str:
    """The body of a character class (no brackets) for \\p{name}."""
    if name.startswith("Is"):
        block = _BLOCKS.get(name[2:])
        if block is None:
            raise RegexSyntaxError(f"unsupported Unicode block \\p{{{name}}}")
        return _ranges_to_class([block])
    table = _category_ranges()
    if len(name) == 1 and name in "LMNPZSC":
        ranges = sorted(r for cat, rs in table.items() if cat.startswith(name) for r in rs)
    elif len(name) == 2 and name in table:
        ranges = table[name]
    elif name in ("Cn", "Co", "Cs"):
        ranges = table.get(name, [])
    else:
        raise RegexSyntaxError(f"unknown Unicode category \\p{{{name}}}")
    return _ranges_to_class(ranges)


# Syntax tree: ("char", predicate index) | ("cat", [nodes]) | ("alt", [nodes])
# | ("rep", node, min, max or None) | ("bol",) | ("eol",)
CharNode = tuple[Literal["char"], int]
CatNode = tuple[Literal["cat"], list["Node"]]
AltNode = tuple[Literal["alt"], list["Node"]]
RepNode = tuple[Literal["rep"], "Node", int, int | None]
Node = CharNode | CatNode | AltNode | RepNode | tuple[Literal["bol"]] | tuple[Literal["eol"]]


class _Parser:
    """Recursive descent over regExp ::= branch ('|' branch)* ; branch ::= (atom quantifier?)*"""

    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.pos = 0
        self.predicates: dict[str, int] = {}  # one-character Python pattern -> index
        self._bodies: list[list[str]] = []  # bodies of the character classes being built

    def error(self, what: str) -> RegexSyntaxError:
        return RegexSyntaxError(f"{what} at position {self.pos} of the pattern")

    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.src[i] if i < len(self.src) else ""

    def parse(self) -> Node:
        node = self.regexp()
        if self.pos != len(self.src):
            raise self.error("unbalanced ')'")
        return node

    def regexp(self) -> Node:
        branches = [self.branch()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.branch())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def branch(self) -> Node:
        items: list[Node] = []
        while self.pos < len(self.src) and self.peek() not in "|)":
            atom = self.atom()
            items.append(self.quantified(atom))
        return ("cat", items)

    def quantified(self, atom: Node) -> Node:
        ch = self.peek()
        if ch == "*":
            low, high = 0, None
        elif ch == "+":
            low, high = 1, None
        elif ch == "?":
            low, high = 0, 1
        elif ch == "{":
            m = re.compile(r"\{([0-9]+)(,([0-9]*))?\}").match(self.src, self.pos)
            if not m:
                raise self.error("bad {n,m} quantifier")
            low = int(m.group(1))
            high = None if m.group(2) and not m.group(3) else int(m.group(3) or low)
            if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
                raise self.error(f"repetition count above {MAX_REPEAT}")
            if high is not None and high < low:
                raise self.error("{n,m} with m < n")
            self.pos = m.end() - 1
        else:
            return atom
        self.pos += 1
        if self.peek() == "?":  # reluctant: same set of matches
            self.pos += 1
        if self.peek() in ("*", "+", "?", "{") and self.peek():
            raise self.error("quantifier follows a quantifier")
        if atom[0] in ("bol", "eol"):
            raise self.error("an anchor cannot be repeated")
        return ("rep", atom, low, high)

    def predicate(self, python_text: str) -> Node:
        index = self.predicates.setdefault(python_text, len(self.predicates))
        return ("char", index)

    def atom(self) -> Node:
        ch = self.peek()
        if ch == "(":
            self.pos += 1
            if self.peek() == "?":
                if self.peek(1) != ":":
                    raise self.error("only (?:...) groups are allowed")
                self.pos += 2
            inner = self.regexp()
            if self.peek() != ")":
                raise self.error("missing ')'")
            self.pos += 1
            return inner
        if ch == "[":
            return self.predicate(self.char_class())
        if ch == "\\":
            return self.predicate(self.escape(in_class=False))
        if ch in ("*", "+", "?", "{"):
            raise self.error(f"quantifier {ch!r} without anything to repeat")
        if ch in ("]", "}"):
            raise self.error(f"unescaped {ch!r}")
        self.pos += 1
        if ch == ".":
            return self.predicate("[^\\n\\r]")
        if ch == "^":
            return ("bol",)
        if ch == "$":
            return ("eol",)
        return self.predicate(re.escape(ch))

    def escape(self, in_class: bool) -> str:
        """Translates the escape at pos (a backslash); inside a class returns class-body text."""
        ch = self.peek(1)
        if not ch:
            raise self.error("pattern ends with a backslash")
        self.pos += 2
        if ch in _SINGLE_ESCAPES:
            lit = _SINGLE_ESCAPES[ch]
            return _class_char(ord(lit)) if in_class else re.escape(lit)
        if ch in _META:
            return _class_char(ord(ch)) if in_class else re.escape(ch)
        if ch in "dD":
            return "\\" + ch
        if ch == "s":
            return " \\t\\n\\r" if in_class else "[ \\t\\n\\r]"
        if ch == "S":
            return "\\S" if in_class else "[^ \\t\\n\\r]"
        if ch == "w":
            return "\\w" if in_class else "[^\\W_]"
        if ch == "W":
            return "\\W" if in_class else "[\\W_]"
        if ch in "ic":
            body = _NAME_START if ch == "i" else _NAME_CHAR
            return body if in_class else f"[{body}]"
        if ch in "IC":
            if in_class:
                raise self.error(f"\\{ch} inside a character class is not supported")
            return f"[^{_NAME_START if ch == 'I' else _NAME_CHAR}]"
        if ch in "pP":
            m = re.compile(r"\{([A-Za-z0-9-]+)\}").match(self.src, self.pos)
            if not m:
                raise self.error(f"bad \\{ch}{{...}} escape")
            self.pos = m.end()
            body = _property_class(m.group(1))
            if ch == "P":
                if in_class:
                    raise self.error("\\P{...} inside a character class is not supported")
                return f"[^{body}]"
            return body if in_class else f"[{body}]"
        if ch.isdigit() and not in_class:
            raise self.error("back-references are not supported (no linear-time matching)")
        raise self.error(f"unknown escape \\{ch}")

    def char_class(self) -> str:
        """Translates [...] (with XSD subtraction) starting at pos."""
        body: list[str] = []
        self._bodies.append(body)
        try:
            return self._char_class(body)
        finally:
            self._bodies.pop()

    def _char_class(self, body: list[str]) -> str:
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        if self.peek() == "]":
            raise self.error("empty character class")
        while True:
            ch = self.peek()
            if not ch:
                raise self.error("missing ']'")
            if ch == "]":
                self.pos += 1
                break
            if ch == "-" and self.peek(1) == "[" and body:
                self.pos += 1
                subtracted = self.char_class()
                if self.peek() != "]":
                    raise self.error("a class subtraction must end the class")
                self.pos += 1
                base = "[" + ("^" if negated else "") + "".join(body) + "]"
                return f"(?:(?!{subtracted}){base})"
            if ch == "[":
                raise self.error("unescaped '[' inside a character class")
            start = self.char_class_item()
            if start is None:
                continue
            if self.peek() == "-" and self.peek(1) not in ("]", "[", ""):
                self.pos += 1
                end = self.char_class_item()
                if end is None:
                    raise self.error("a range must end with a single character")
                if ord(end) < ord(start):
                    raise self.error("character range out of order")
                body.append(f"{_class_char(ord(start))}-{_class_char(ord(end))}")
            else:
                body.append(_class_char(ord(start)))
        if not body:
            raise self.error("empty character class")
        return "[" + ("^" if negated else "") + "".join(body) + "]"

    def char_class_item(self) -> str | None:
        """Consumes one class item: returns the character if it is a single character (a
        range may follow); a multi-character escape is added to the class body and gives
        None."""
        ch = self.peek()
        if ch == "\\":
            nxt = self.peek(1)
            if nxt in _SINGLE_ESCAPES:
                self.pos += 2
                return _SINGLE_ESCAPES[nxt]
            if nxt in _META:
                self.pos += 2
                return nxt
            self._bodies[-1].append(self.escape(in_class=True))
            return None
        self.pos += 1
        return ch




# --------------------------------------------------------------------------------------------
# Thompson NFA and lazily built DFA

_CHAR, _SPLIT, _BOL, _EOL, _MATCH = range(5)


class _Builder:
    def __init__(self) -> None:
        # Each state a list of ints: [_CHAR, predicate, next], [_SPLIT, next, other next],
        # [_BOL, next], [_EOL, next] or [_MATCH].
        self.states: list[list[int]] = []

    def new(self, *state: int) -> int:
        if len(self.states) >= MAX_NFA_STATES:
            raise RegexSyntaxError(f"pattern too large (more than {MAX_NFA_STATES} states)")
        self.states.append(list(state))
        return len(self.states) - 1

    def build(self, node: Node, nxt: int) -> int:
        """Builds node so that it continues into state nxt; returns its entry state."""
        if node[0] == "char":
            return self.new(_CHAR, node[1], nxt)
        if node[0] == "cat":
            for child in reversed(node[1]):
                nxt = self.build(child, nxt)
            return nxt
        if node[0] == "alt":
            entries = [self.build(child, nxt) for child in node[1]]
            entry = entries[-1]
            for other in reversed(entries[:-1]):
                entry = self.new(_SPLIT, other, entry)
            return entry
        if node[0] == "bol":
            return self.new(_BOL, nxt)
        if node[0] == "eol":
            return self.new(_EOL, nxt)
        _, body, low, high = node
        if high is None:
            loop = self.new(_SPLIT, -1, nxt)
            self.states[loop][1] = self.build(body, loop)
            tail = loop
        else:
            tail = nxt
            for _ in range(high - low):
                tail = self.new(_SPLIT, self.build(body, tail), nxt)
        for _ in range(low):
            tail = self.build(body, tail)
        return tail


@dataclass
class CompiledRegex:
    """A compiled pattern; `search(text)` says whether it matches some part of text."""

    pattern: str
    states: list[list[int]]  # as `_Builder` makes them
    start: int
    predicates: list[Callable[[str], object]]

    def __post_init__(self) -> None:
        self._transitions: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        self._start_at_0 = self._closure((self.start,), at_start=True, at_end=False)
        self._start_later = self._closure((self.start,), at_start=False, at_end=False)
        self._match = next(i for i, s in enumerate(self.states) if s[0] == _MATCH)

    def _closure(self, seeds: Iterable[int], at_start: bool, at_end: bool) -> frozenset[int]:
        states = self.states
        seen: set[int] = set()
        stack = list(seeds)
        while stack:
            index = stack.pop()
            if index in seen:
                continue
            seen.add(index)
            state = states[index]
            kind = state[0]
            if kind == _SPLIT:
                stack.append(state[1])
                stack.append(state[2])
            elif kind == _BOL:
                if at_start:
                    stack.append(state[1])
            elif kind == _EOL and at_end:
                stack.append(state[1])
        return frozenset(i for i in seen if states[i][0] in (_CHAR, _EOL, _MATCH))

    def _step(self, current: frozenset[int], ch: str) -> frozenset[int]:
        states, predicates = self.states, self.predicates
        seeds = [states[i][2] for i in current
                 if states[i][0] == _CHAR and predicates[states[i][1]](ch)]
        nxt = self._closure(seeds, at_start=False, at_end=False) | self._start_later
        if len(self._transitions) >= MAX_CACHED_TRANSITIONS:
            self._transitions.clear()
        self._transitions[(current, ch)] = nxt
        return nxt

    def search(self, text: str) -> bool:
        match = self._match
        current = self._start_at_0
        if match in current:
            return True
        transitions = self._transitions
        work = 0
        for ch in text:
            nxt = transitions.get((current, ch))
            if nxt is None:
                nxt = self._step(current, ch)
                work += len(current) + len(nxt)
                if work > MAX_SEARCH_WORK:
                    raise RegexBudgetError("pattern too complex for a value this long")
            if match in nxt:
                return True
            current = nxt
        pending = [self.states[i][1] for i in current if self.states[i][0] == _EOL]
        final = self._closure(pending, at_start=not text, at_end=True)
        return match in final


@lru_cache(maxsize=1024)
def compile_xsd_regex(pattern: str) -> CompiledRegex:
    """Parses and compiles a pattern (cached); raises RegexSyntaxError if it is invalid."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexSyntaxError(f"pattern longer than {MAX_PATTERN_CHARS} characters")
    parser = _Parser(pattern)
    tree = parser.parse()
    builder = _Builder()
    accept = builder.new(_MATCH)
    start = builder.build(tree, accept)
    try:
        predicates: list[Callable[[str], object]] = [re.compile(text).fullmatch
                      for text, _ in sorted(parser.predicates.items(), key=lambda kv: kv[1])]
    except re.error as exc:
        raise RegexSyntaxError(f"invalid character class ({exc})") from None
    return CompiledRegex(pattern, builder.states, start, predicates)
