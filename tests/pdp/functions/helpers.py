"""Small helpers shared by the function tests: parse values and call functions by short id."""
from __future__ import annotations

from typing import Any

from pdp.datatypes import get_datatype
from pdp.functions import FUNCTIONS, get_function

PREFIXES = (
    "urn:oasis:names:tc:xacml:3.0:function:",
    "urn:oasis:names:tc:xacml:2.0:function:",
    "urn:oasis:names:tc:xacml:1.0:function:",
)


def fid(short: str) -> str:
    """Full id for a short name, preferring the 3.0 id when several exist."""
    for prefix in PREFIXES:
        if prefix + short in FUNCTIONS:
            return prefix + short
    raise KeyError(short)


def call(short: str, *args: Any) -> Any:
    return get_function(fid(short)).impl(*args)


def v(datatype_short: str, lexical: str) -> Any:
    from pdp.datatypes import JSON_SHORTHANDS
    return get_datatype(JSON_SHORTHANDS[datatype_short]).parse(lexical)
