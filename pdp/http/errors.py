"""The PDP's error table: the shared kinds of refusal (`common.http.errors.REFUSAL_STATUS`) and
the PDP's own errors, each with its status.

The PDP's routes raise what went wrong (`common.refusals`, the PDP's errors) and let the
service's and the store's errors through; the app that mounts the PDP's blueprint answers them
through this table (`common.http.errors.install_error_handlers`), with the one JSON error body.
An embedder adds its own kinds over it, and may give a kind of this one a status of its own.
"""
from __future__ import annotations

from common.http.errors import REFUSAL_STATUS
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.service import PolicyIdMismatchError
from pdp.store import PolicyExistsError, PolicyNotFoundError

# exception type -> HTTP status (see `common.http.errors.status_for`: the MRO decides)
ERROR_STATUS: dict[type[BaseException], int] = {
    **REFUSAL_STATUS,
    PolicyIdMismatchError: 400,
    PolicyLoadError: 400,
    RequestSyntaxError: 400,
    PolicyNotFoundError: 404,
    PolicyExistsError: 409,
}

__all__ = ["ERROR_STATUS"]
