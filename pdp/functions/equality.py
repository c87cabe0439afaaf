"""Equality predicates (XACML 3.0 A.3.1): `T-equal` for every type that has one.

Python `==` on the value classes of `pdp.datatypes` already is the XACML equality of each
type (normalized RDNs for x500Name, case-insensitive domain for rfc822Name); doubles use IEEE
equality except that NaN equals NaN, as the conformance suite requires.
ipAddress and dnsName have no equality function in the standard; their regexp-match is the
way to test them.
"""
from __future__ import annotations

from pdp import datatypes as dt
from pdp.functions.base import F3, LEGACY_DURATION_FAMILIES, TYPED_FAMILIES, Param, register

_NO_EQUAL = {"ipAddress", "dnsName"}


def _equal(a: object, b: object) -> bool:
    return a == b


def _double_equal(a: float, b: float) -> bool:
    """IEEE equality, except that NaN equals NaN (conformance tests IIC350, IIC358)."""
    return dt.values_equal(a, b)


def _equal_ignore_case(a: str, b: str) -> bool:
    return a.lower() == b.lower()


for _name, _type, _prefix in TYPED_FAMILIES + LEGACY_DURATION_FAMILIES:
    if _name in _NO_EQUAL:
        continue
    register(f"{_prefix}{_name}-equal", dt.BOOLEAN, (Param(_type), Param(_type)),
             _double_equal if _name == "double" else _equal)

register(F3 + "string-equal-ignore-case", dt.BOOLEAN, (Param(dt.STRING), Param(dt.STRING)),
         _equal_ignore_case)
