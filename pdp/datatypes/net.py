"""ipAddress and dnsName: an address with optional mask and port range, a host name (with an
optional leading wildcard) with optional port range."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from pdp.datatypes.common import fail


@dataclass(frozen=True)
class PortRange:
    """A port range; None for an open end ("-80" is 0..80 in effect, "8080-" is 8080..)."""

    low: int | None
    high: int | None

    def __str__(self) -> str:
        if self.low is not None and self.low == self.high:
            return str(self.low)
        return f"{'' if self.low is None else self.low}-{'' if self.high is None else self.high}"

    def contains(self, port: int) -> bool:
        return (self.low is None or port >= self.low) and (self.high is None or port <= self.high)


def _parse_port(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or int(text) > 65535:
        fail(f"bad port number {text!r}")
    return int(text)


def parse_portrange(text: str) -> PortRange:
    if "-" not in text:
        port = _parse_port(text)
        return PortRange(port, port)
    low_text, _, high_text = text.partition("-")
    if not low_text and not high_text:
        fail("port range '-' has no bound")
    low = _parse_port(low_text) if low_text else None
    high = _parse_port(high_text) if high_text else None
    if low is not None and high is not None and low > high:
        fail(f"port range {text} is empty")
    return PortRange(low, high)


@dataclass(frozen=True)
class IPAddressValue:
    """An XACML ipAddress: address, optional mask, optional port range."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    mask: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    ports: PortRange | None = None

    def __str__(self) -> str:
        v6 = self.address.version == 6
        out = f"[{self.address}]" if v6 else str(self.address)
        if self.mask is not None:
            out += f"/[{self.mask}]" if v6 else f"/{self.mask}"
        if self.ports is not None:
            out += f":{self.ports}"
        return out


def parse_ipaddress(text: str) -> IPAddressValue:
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    mask: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        if text.startswith("["):
            end = text.find("]")
            if end < 0:
                fail("unterminated [IPv6 address]")
            address = ipaddress.IPv6Address(text[1:end])
            rest = text[end + 1:]
            mask = None
            if rest.startswith("/"):
                if not rest.startswith("/["):
                    fail("an IPv6 mask must be written in brackets")
                mend = rest.find("]")
                if mend < 0:
                    fail("unterminated [IPv6 mask]")
                mask = ipaddress.IPv6Address(rest[2:mend])
                rest = rest[mend + 1:]
        else:
            addr_part, colon, port_text = text.partition(":")
            rest = colon + port_text
            addr_text, slash, mask_text = addr_part.partition("/")
            address = ipaddress.IPv4Address(addr_text)
            mask = ipaddress.IPv4Address(mask_text) if slash else None
    except ipaddress.AddressValueError as exc:
        fail(str(exc))
    ports = None
    if rest:
        if not rest.startswith(":"):
            fail(f"unexpected {rest!r} after the address")
        if rest[1:]:
            ports = parse_portrange(rest[1:])
    return IPAddressValue(address, mask, ports)


_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DNS_RE = re.compile(rf"(?:\*\.)?(?:{_HOST_LABEL}\.)*{_HOST_LABEL}\.?|\*")


@dataclass(frozen=True, eq=False)
class DNSNameValue:
    """An XACML dnsName: host name (leading "*." wildcard allowed) and optional port range.

    Host names compare case-insensitively; the text keeps the case it was written in.
    """

    host: str
    ports: PortRange | None = None

    def _key(self) -> tuple[str, PortRange | None]:
        return self.host.lower(), self.ports

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DNSNameValue):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.host if self.ports is None else f"{self.host}:{self.ports}"


def parse_dnsname(text: str) -> DNSNameValue:
    host, colon, port_text = text.partition(":")
    if len(host) > 253 or not _DNS_RE.fullmatch(host):
        fail("bad host name")
    ports = parse_portrange(port_text) if colon and port_text else None
    return DNSNameValue(host, ports)

