"""The XACML 3.0 `T-from-string` and `string-from-T` conversions (A.3.9).

`T-from-string` accepts exactly the lexical forms an <AttributeValue> of type T accepts and is
Indeterminate on anything else; `string-from-T` gives the form `DataType.format` gives.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdp import datatypes as dt
from pdp.errors import ValueSyntaxError
from pdp.functions.base import F3, Param, fail, register

_CONVERTIBLE = (
    "boolean", "integer", "double", "time", "date", "dateTime", "anyURI", "dayTimeDuration",
    "yearMonthDuration", "x500Name", "rfc822Name", "ipAddress", "dnsName",
)


def _from_string(function_id: str, datatype: dt.DataType) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return datatype.parse(text)
        except ValueSyntaxError as exc:
            raise fail(function_id, str(exc)) from None
    return convert


def _to_string(datatype: dt.DataType) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        return datatype.format(value)
    return convert


for _name in _CONVERTIBLE:
    _uri = dt.JSON_SHORTHANDS[_name]
    _type = dt.get_datatype(_uri)
    _id = f"{F3}{_name}-from-string"
    register(_id, _uri, (Param(dt.STRING),), _from_string(_id, _type))
    register(f"{F3}string-from-{_name}", dt.STRING, (Param(_uri),), _to_string(_type))
