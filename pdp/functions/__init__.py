"""The XACML 3.0 standard function library.

    from pdp.functions import FUNCTIONS, get_function, Function, Param

Importing the package registers every family; see `Function` for the calling conventions.
"""
from __future__ import annotations

from pdp.functions import (  # noqa: F401  (imported for their registrations)
    arithmetic,
    bags,
    comparison,
    conversion,
    equality,
    higher_order,
    logical,
    regexp,
    sets,
    special,
    strings,
    temporal,
)
from pdp.functions.base import (
    FUNCTION_PARAM,
    FUNCTIONS,
    ArgSig,
    Function,
    Param,
    get_function,
    signature_error,
)

__all__ = [
    "FUNCTIONS",
    "FUNCTION_PARAM",
    "ArgSig",
    "Function",
    "Param",
    "get_function",
    "signature_error",
]
