"""The PDP's HTTP face: health, decisions (POST /pdp, and AuthZEN's /access/v1/...) and the
PAP (/policies).

The routes are module-level functions: decisions in `pdp.http.decisions` and
`pdp.http.authzen`, the PAP in `pdp.http.policies`, health here; `create_pdp_blueprint` gives an
app a blueprint over them and keeps its parameters (`PdpRoutes`, `pdp.http.context`) in the
app's extensions, where each route finds them (`current_pdp()`). A route answers only what it
was asked for: what went wrong it raises as a kind (`common.refusals`, the PDP's own errors),
and the app's error table (`pdp.http.errors.ERROR_STATUS` under the embedder's, through
`common.http.errors`) gives its status and the one JSON error body.

Two rules shape this module. The subject of a decision is the authenticated caller: the
request's subject-id and role attributes are overwritten with the token's identity before the
engine sees them. And nothing a client sends can produce a 500: every parse, load or store
error maps to a 4xx that says what went wrong and where.

Who may change which policy is one function (`pdp.manage`); the blueprint takes it as a
parameter so that the PEP can widen it (stream owners for the policies about their streams)
without touching these modules. A falsy `Veto` answer becomes a 403 that carries its reason.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flask import Blueprint, Response as FlaskResponse, jsonify, request

from common.refusals import Unavailable
from pdp.http.authzen import (
    CONFIGURATION_PATH,
    EVALUATION_PATH,
    EVALUATIONS_PATH,
    authzen_configuration,
    authzen_evaluation,
    authzen_evaluations,
    echo_request_id,
)
from pdp.http.context import (
    PDP_EXTENSION,
    CheckPolicy,
    Describe,
    Environment,
    PdpRoutes,
    PolicyFormat,
    WhatIf,
    current_pdp,
    read_body,
)
from pdp.http.decisions import decide, decide_as
from pdp.http.policies import (
    STORED_NOT_YOURS,
    add_policies,
    add_policy,
    delete_policy,
    get_policy,
    list_policies,
    update_policy,
)
from pdp.manage import ManagePolicy, may_manage_policy
from pdp.service import PolicyService


def create_pdp_blueprint(service: PolicyService,
                         may_manage: ManagePolicy = may_manage_policy,
                         check_policy: CheckPolicy | None = None,
                         environment: Environment | None = None,
                         health_details: Callable[[], dict[str, Any]] | None = None,
                         formats: Sequence[PolicyFormat] = (),
                         what_if: WhatIf | None = None,
                         describe: Describe | None = None,
                         base_url: str | None = None) -> Blueprint:
    """Routes: GET /health, POST /pdp, AuthZEN 1.0 (POST /access/v1/evaluation and
    /access/v1/evaluations, GET /.well-known/authzen-configuration, whose URLs start with
    `base_url`, else with the URL a request reached us by), and the PAP under /policies.

    `health_details()` adds the embedder's own parts to GET /health (the gateway: its streams);
    a non-empty `problems` list among them makes the status `degraded` (still 200: decisions
    are served, so a load balancer should not take the gateway out).

    `check_policy(document, source)` runs before a policy is written: it returns warnings for the
    answer or raises PolicyLoadError (400) when the policy cannot work (the gateway checks
    obligations against stream schemas). `environment(resource_ids)` gives the gateway's own
    environment attributes for a request naming those resource-ids, which a decision sees instead of
    the request's (`pdp.request.bind_environment`).

    `formats` are other media types a policy may be written in (and read back as, by Accept).
    `describe(stored)` adds fields to each policy of GET /policies and to a write's answer (the
    gateway: a one-line summary of what it grants). A write with `?dry_run=true` is judged and
    checked exactly as the write, then answered 200 with what it would do (`what_if(identity,
    prospect)`, the change computed against the live engine) and nothing is applied."""
    bp = Blueprint("pdp", __name__)
    routes = PdpRoutes(service, may_manage, check_policy, environment, health_details,
                       tuple(formats), what_if, describe, base_url)
    bp.record_once(lambda state: state.app.extensions.__setitem__(PDP_EXTENSION, routes))
    bp.before_request(engine_loaded)
    bp.after_request(echo_request_id)
    bp.add_url_rule("/health", view_func=health, methods=["GET"])
    bp.add_url_rule("/pdp", view_func=decide, methods=["POST"])
    bp.add_url_rule(EVALUATION_PATH, view_func=authzen_evaluation, methods=["POST"])
    bp.add_url_rule(EVALUATIONS_PATH, view_func=authzen_evaluations, methods=["POST"])
    bp.add_url_rule(CONFIGURATION_PATH, view_func=authzen_configuration, methods=["GET"])
    bp.add_url_rule("/policies", view_func=list_policies, methods=["GET"])
    bp.add_url_rule("/policies", view_func=add_policy, methods=["POST"])
    # ids may hold "//"
    bp.add_url_rule("/policies/<path:policy_id>", view_func=get_policy, methods=["GET"],
                    merge_slashes=False)
    bp.add_url_rule("/policies/<path:policy_id>", view_func=update_policy, methods=["PUT"],
                    merge_slashes=False)
    bp.add_url_rule("/policies/bulk", view_func=add_policies, methods=["POST"])
    bp.add_url_rule("/policies/<path:policy_id>", view_func=delete_policy, methods=["DELETE"],
                    merge_slashes=False)
    return bp



def engine_loaded() -> FlaskResponse | None:
    """Every PDP route but /health and AuthZEN's metadata waits for the engine (503 until it
    is loaded)."""
    pdp = current_pdp()
    if not pdp.service.ready and request.endpoint not in ("pdp.health",
                                                          "pdp.authzen_configuration"):
        raise Unavailable("policy engine not loaded; see GET /health")
    return None


def health() -> FlaskResponse:
    """GET /health: the engine's state (503 while it loads) and the embedder's parts."""
    pdp = current_pdp()
    if not pdp.service.ready:
        # the health document itself, not an error body: its `status` is the engine's state
        response = jsonify(status="starting", error="policy engine not loaded")
        response.status_code = 503
        return response
    details = pdp.health_details() if pdp.health_details is not None else {}
    status = "degraded" if details.get("problems") else "ready"
    return jsonify(status=status, policies=len(pdp.service.engine.policies),
                   store_version=pdp.service.store.store_version(), **details)


__all__ = ["STORED_NOT_YOURS", "CheckPolicy", "Describe", "Environment", "PdpRoutes",
           "PolicyFormat", "WhatIf", "create_pdp_blueprint", "current_pdp", "decide_as",
           "engine_loaded", "health", "read_body"]
