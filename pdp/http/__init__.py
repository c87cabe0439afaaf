"""The PDP's HTTP face: the blueprint (`api`) over the decision route (`decisions`), AuthZEN
(`authzen`), the explanation (`why`) and the PAP (`policies`), what they work with (`context`),
and the PDP's error table (`errors`: its errors over the shared kinds of refusal).

Request authentication, the one JSON error body and the bounded JSON parser are the common
package's (`common.http`): the gateway and the proxy use them too. The gateway imports the names
below and nothing else of this package (`tests/test_layout.py`)."""
from __future__ import annotations

from pdp.http.api import STORED_NOT_YOURS, create_pdp_blueprint, decide_as
from pdp.http.context import Environment, PolicyFormat, read_body
from pdp.http.errors import ERROR_STATUS

__all__ = ["ERROR_STATUS", "Environment", "PolicyFormat", "STORED_NOT_YOURS",
           "create_pdp_blueprint", "decide_as", "read_body"]
