"""XACML versions: the VersionType syntax of a Policy(Set)'s Version, and the matching of a
reference's Version, EarliestVersion and LatestVersion patterns (XACML 3.0 section 5.13)."""
from __future__ import annotations

import re

# ASCII digits ([0-9], never \d, which takes every Unicode decimal digit), at most 18 to a
# number so that each fits a 64-bit integer, at most MAX_VERSION_TEXT characters in all
MAX_VERSION_TEXT = 255
_VERSION_RE = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,18})*")
_VERSION_PATTERN_RE = re.compile(r"(?:(?:[0-9]{1,18}|[*+])\.)*(?:[0-9]{1,18}|[*+])")


def is_version(text: str) -> bool:
    """A XACML VersionType: ASCII numbers of at most 18 digits joined by dots ('1', '2.0.1')."""
    return len(text) <= MAX_VERSION_TEXT and _VERSION_RE.fullmatch(text) is not None


def is_version_pattern(text: str) -> bool:
    """A reference's Version, EarliestVersion or LatestVersion: numbers, '*' or '+' joined by
    dots ('1.*', '2.+.1'), at most MAX_VERSION_TEXT characters."""
    return len(text) <= MAX_VERSION_TEXT and _VERSION_PATTERN_RE.fullmatch(text) is not None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts = []
    for token in pattern.split("."):
        if token == "*":
            parts.append(r"[0-9]+(?:\.[0-9]+)*")
        elif token == "+":
            parts.append(r"[0-9]+")
        else:
            parts.append(re.escape(token))
    return re.compile("^" + r"\.".join(parts) + "$")


def _bound(pattern: str, low: bool) -> tuple[int, ...]:
    # A wildcard in Earliest/LatestVersion makes that position unbounded.
    out = []
    for token in pattern.split("."):
        if token in ("*", "+"):
            out.append(-1 if low else 1 << 62)
            if token == "*":
                break
        else:
            out.append(int(token))
    return tuple(out)


def version_matches(version: str, exact: str | None, earliest: str | None,
                    latest: str | None) -> bool:
    """XACML 3.0 version matching (section 5.13: digits, '+' one number, '*' any suffix)."""
    if exact is not None and not _pattern_regex(exact).match(version):
        return False
    vt = _version_tuple(version)
    if earliest is not None and vt < _bound(earliest, True):
        return False
    if latest is not None and vt > _bound(latest, False):
        if "*" not in latest or not _pattern_regex(latest).match(version):
            return False
    return True
