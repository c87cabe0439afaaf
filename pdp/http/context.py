"""What the PDP's routes work with: the parameters of `create_pdp_blueprint` (`PdpRoutes`), kept
in the app's extensions where each route finds them (`current_pdp()`), the other forms a policy
may be written in (`PolicyFormat`), and the reading of a request body within its limit."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flask import Response as FlaskResponse, current_app, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from common.auth import Identity
from pdp.manage import ManagedPolicy, ManagePolicy, may_manage_policy
from pdp.service import PolicyService, Prospect
from pdp.store import PolicyNotFoundError, StoredPolicy

XACML_XML = "application/xacml+xml"
XACML_JSON = "application/xacml+json"
# the media types of each request kind, the XACML one first
OFFERED = {"xml": (XACML_XML, "application/xml", "text/xml"),
           "json": (XACML_JSON, "application/json")}


def read_body() -> bytes:
    """The request body, refusing one over MAX_CONTENT_LENGTH even when it came chunked
    (werkzeug then stops at the limit and returns what it read instead of raising)."""
    data = request.get_data(cache=False)
    limit = request.max_content_length
    if limit is not None and len(data) >= limit:
        raise RequestEntityTooLarge()
    return data


@dataclass(frozen=True)
class PolicyFormat:
    """Another way to write a policy than XACML (the gateway's: sharing rules).

    `to_xacml(body, media_type, identity, policy_id)` gives the XACML document the body stands
    for (`policy_id`: the id a PUT names, None for a POST) and warnings for the answer; the
    document is then judged, checked, stored and decided like any other. It may raise, and the
    app's error handlers answer (a 4xx naming what is wrong). `from_xacml(document,
    media_type)` gives a stored document in this form, or None when it cannot be written so."""

    media_types: tuple[str, ...]
    to_xacml: Callable[[bytes, str, Identity, str | None], tuple[bytes, list[str]]]
    from_xacml: Callable[[bytes, str], bytes | None]


CheckPolicy = Callable[[bytes, str], list[str]]
# the embedder's environment attributes for a request naming these resource-ids
Environment = Callable[[list[str]], list[tuple[str, str, list[str]]]]
WhatIf = Callable[[Identity, Prospect], Mapping[str, object]]
Describe = Callable[[StoredPolicy], dict[str, Any]]


PDP_EXTENSION = "xsg.pdp"  # app.extensions: the PdpRoutes of the app's PDP blueprint


@dataclass(frozen=True)
class PdpRoutes:
    """What the PDP's routes work with (the parameters of `create_pdp_blueprint`), kept in the
    app's extensions: the routes are module-level functions that find it with `current_pdp()`."""

    service: PolicyService
    may_manage: ManagePolicy = may_manage_policy
    check_policy: CheckPolicy | None = None
    environment: Environment | None = None
    health_details: Callable[[], dict[str, Any]] | None = None
    formats: Sequence[PolicyFormat] = ()
    what_if: WhatIf | None = None
    describe: Describe | None = None
    base_url: str | None = None  # the public URL AuthZEN's metadata names; None: the request's

    def described(self, stored: StoredPolicy) -> dict[str, Any]:
        return self.describe(stored) if self.describe is not None else {}

    def dry_run_answer(
        self, identity: Identity, prospect: Prospect, **fields: Any
    ) -> FlaskResponse:
        report = self.what_if(identity, prospect) if self.what_if is not None else None
        return jsonify({"dry_run": True, "change": prospect.kind, "id": prospect.policy_id,
                        **fields, "what_if": report})

    def checked(self, body: bytes, source: str = "request body") -> list[str]:
        return self.check_policy(body, source) if self.check_policy is not None else []

    def writer_of(self, policy_id: str) -> str:
        """Who wrote the stored current version ("" when it cannot be read: no reason then)."""
        try:
            return self.service.get(policy_id).owner
        except PolicyNotFoundError:
            return ""

    def existing_info(self, policy_id: str,
                      stored: StoredPolicy | None = None) -> ManagedPolicy | None:
        """The live policy with its stored current document; None when there is none."""
        info = self.service.policy_info(policy_id)
        if info is None:
            return None
        if stored is None:
            try:
                stored = self.service.get(policy_id)
            except PolicyNotFoundError:
                return None
        return ManagedPolicy.of(info, stored.data)


def current_pdp() -> PdpRoutes:
    """The PDP of the app serving the current request."""
    routes: PdpRoutes = current_app.extensions[PDP_EXTENSION]
    return routes
