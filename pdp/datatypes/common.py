"""What every value family's parser shares: how it reports a bad lexical value, the XML
whitespace the `collapse` facet trims, and the exact decimal context of seconds."""
from __future__ import annotations

from decimal import Context
from typing import NoReturn

XML_WS = " \t\r\n"
# Exact decimal arithmetic for seconds; wide enough for any year a policy could mention.
DEC = Context(prec=200)


def fail(why: str) -> NoReturn:
    """Rejects a lexical value; DataType.parse turns this into a ValueSyntaxError."""
    raise ValueError(why)

