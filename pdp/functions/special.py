"""Special match functions (A.3.14): x500Name-match and rfc822Name-match."""
from __future__ import annotations

from pdp import datatypes as dt
from pdp.errors import ValueSyntaxError
from pdp.functions.base import F1, Param, fail, register


def _x500_match(pattern: dt.X500Name, name: dt.X500Name) -> bool:
    """True if the first name equals a terminal sequence of the second's RDNs, i.e. the
    first names an ancestor (or the same node) of the second in the directory tree.

    RFC 2253 writes the most specific RDN first, so "terminal" means the end of the string:
    "o=Medico, c=US" matches "cn=John, o=Medico, c=US".
    """
    count = len(pattern.rdns)
    if count > len(name.rdns):
        return False
    return count == 0 or name.rdns[-count:] == pattern.rdns


def _rfc822_match(pattern: str, name: dt.Rfc822Name) -> bool:
    """Matches an e-mail address against a mailbox, a host or a domain.

    - "Anderson@sun.com": that mailbox (local part case-sensitive, domain not);
    - "sun.com": any mailbox at exactly that host;
    - ".east.sun.com": any mailbox at a host inside that domain (not at the host itself).
    """
    if "@" in pattern:
        try:
            mailbox: dt.Rfc822Name = dt.get_datatype(dt.RFC822NAME).parse(pattern)
            return mailbox == name
        except ValueSyntaxError as exc:
            raise fail(F1 + "rfc822Name-match", str(exc)) from None
    wanted = pattern.lower()
    if wanted.startswith("."):
        return name.domain.endswith(wanted)
    return name.domain == wanted


register(F1 + "x500Name-match", dt.BOOLEAN, (Param(dt.X500NAME), Param(dt.X500NAME)), _x500_match)
register(F1 + "rfc822Name-match", dt.BOOLEAN, (Param(dt.STRING), Param(dt.RFC822NAME)),
         _rfc822_match)
