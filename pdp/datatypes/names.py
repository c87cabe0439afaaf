"""x500Name and rfc822Name: distinguished names (RFC 4514, compared by normalized RDNs) and
e-mail addresses (the domain compared case-insensitively)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from pdp.datatypes.common import fail

_RDN_SEPARATORS = ",;"


def _split_unescaped(text: str, separators: str) -> list[str]:
    """Splits on separators that are neither backslash-escaped nor inside double quotes."""
    parts, current, i, quoted = [], [], 0, False
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch in separators and not quoted:
            parts.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    if quoted:
        fail("unterminated quoted value")
    parts.append("".join(current))
    return parts


def _strip_dn_value(raw: str) -> str:
    """Strips insignificant spaces, keeping an escaped trailing space ("a\\ ")."""
    value = raw.lstrip()
    while value.endswith(" ") and not value.endswith("\\ "):
        value = value[:-1]
    return value


def _unescape_dn_value(raw: str) -> str:
    value = _strip_dn_value(raw)
    if value.startswith('"') and value.endswith('"') and len(value) >= 2:
        value = value[1:-1]
    out, i = bytearray(), 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            nxt = value[i + 1:i + 3]
            if len(nxt) == 2 and all(c in "0123456789abcdefABCDEF" for c in nxt):
                out += bytes.fromhex(nxt)
                i += 3
                continue
            if i + 1 >= len(value):
                fail("dangling escape")
            out += value[i + 1].encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        fail("escaped bytes are not UTF-8")


def _normalize_dn_value(value: str) -> str:
    # RFC 3280 4.1.2.4 / RFC 4518 string preparation, simplified: case-insensitive and
    # insignificant whitespace collapsed.
    return " ".join(value.split()).casefold()


_ATTR_TYPE_RE = re.compile(r"(?:[A-Za-z][A-Za-z0-9-]*|(?:oid\.|OID\.)?[0-9]+(?:\.[0-9]+)*)")


@dataclass(frozen=True)
class X500Name:
    """An X.500 distinguished name (RFC 2253 string form).

    `rdns` is the normalized comparison key: one tuple per RDN, most specific first (as
    written), each a sorted tuple of (attribute type, normalized value) pairs.
    """

    rdns: tuple[tuple[tuple[str, str], ...], ...]
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


def parse_x500(text: str) -> X500Name:
    if not text:
        return X500Name((), text)
    rdns = []
    for rdn_text in _split_unescaped(text, _RDN_SEPARATORS):
        avas = []
        for ava in _split_unescaped(rdn_text, "+"):
            attr, sep, raw_value = ava.partition("=")
            attr = attr.strip()
            if not sep or not _ATTR_TYPE_RE.fullmatch(attr):
                fail(f"bad attribute type and value {ava.strip()!r}")
            attr = attr.lower()
            if attr.startswith("oid."):
                attr = attr[4:]
            raw_value = _strip_dn_value(raw_value)
            if raw_value.startswith("#"):
                hexpart = raw_value[1:]
                if not hexpart or len(hexpart) % 2 or not re.fullmatch(r"[0-9A-Fa-f]+", hexpart):
                    fail(f"bad hex value {raw_value!r}")
                value = "#" + hexpart.lower()
            else:
                value = _normalize_dn_value(_unescape_dn_value(raw_value))
            avas.append((attr, value))
        rdns.append(tuple(sorted(avas)))
    return X500Name(tuple(rdns), text)


@dataclass(frozen=True)
class Rfc822Name:
    """An e-mail address: the local part is case-sensitive, the domain is not."""

    local: str
    domain: str  # lower-cased
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


_LOCAL_RE = re.compile(r'[^\s@]+|"[^"]*"')
_DOMAIN_RE = re.compile(
    r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?|\[[^\]\s]+\]"
)


def parse_rfc822(text: str) -> Rfc822Name:
    local, sep, domain = text.rpartition("@")
    if not sep or not local or not domain:
        fail("expected local-part@domain")
    if not _LOCAL_RE.fullmatch(local) or not _DOMAIN_RE.fullmatch(domain):
        fail("bad local part or domain")
    return Rfc822Name(local, domain.lower(), text)

