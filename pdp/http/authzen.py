"""The AuthZEN Authorization API 1.0 over HTTP: POST /access/v1/evaluation, POST
/access/v1/evaluations and GET /.well-known/authzen-configuration (`pdp.authzen` maps the
requests and answers; this module is only the HTTP binding).

Every decision is POST /pdp's (`decide_as`: the caller bound as the access subject, the
gateway's clock and environment), so an AuthZEN answer never says more than POST /pdp would
tell the same caller. The subject is who authenticated: a body naming another subject is
refused (403, saying where), not answered for someone else. POST /pdp overwrites whatever
subject its request names; AuthZEN's subject is required and names one explicitly, so an
answer about the caller would read as an answer about the subject named. No caller,
administrators included, evaluates for another subject, as on POST /pdp.

Refusals are the gateway's one error body (RFC 9457; the spec asks only for "an error message
string"), with `field`, the JSON pointer of what is wrong. `X-Request-ID` comes back on every
answer, refusals included, as the spec asks.
"""
from __future__ import annotations

import re
from typing import Any

from flask import Response as FlaskResponse, jsonify, request

from common.auth import Identity
from common.http.auth import current_identity, require_identity
from common.refusals import (
    InputTooLarge,
    InvalidInput,
    NotAcceptable,
    NotPermitted,
    UnsupportedMedia,
)
from common.xmlsafe import UnsafeDocumentError, parse_json
from pdp.authzen import (
    AuthzenInputError,
    Batch,
    Evaluation,
    decision_json,
    evaluations_json,
    parse_evaluation,
    parse_evaluations,
    run_batch,
)
from pdp.http.context import current_pdp, read_body
from pdp.http.decisions import decide_as
from pdp.results import Result

EVALUATION_PATH = "/access/v1/evaluation"
EVALUATIONS_PATH = "/access/v1/evaluations"
CONFIGURATION_PATH = "/.well-known/authzen-configuration"
ENDPOINTS = frozenset({"pdp.authzen_evaluation", "pdp.authzen_evaluations",
                       "pdp.authzen_configuration"})
REQUEST_ID = "X-Request-ID"
_REQUEST_ID_SHAPE = re.compile(r"[\x20-\x7e]{1,256}")


def _body() -> Any:
    """The request's JSON document (application/json, within the size and depth limits)."""
    if request.mimetype != "application/json":
        raise UnsupportedMedia(f"unsupported Content-Type "
                               f"{request.headers.get('Content-Type')!r}: use application/json")
    if request.headers.get("Accept") and \
            request.accept_mimetypes.best_match(["application/json"]) is None:
        raise NotAcceptable(f"cannot answer in {request.headers.get('Accept')!r}: "
                            "application/json is offered")
    request_id = request.headers.get(REQUEST_ID)
    if request_id is not None and not _REQUEST_ID_SHAPE.fullmatch(request_id):
        raise InvalidInput(f"{REQUEST_ID} must be 1 to 256 printable ASCII characters",
                           field=f"header {REQUEST_ID}")
    try:
        return parse_json(read_body())
    except UnsafeDocumentError as exc:
        raise InvalidInput(f"the body is not a JSON document: {exc.message}", field="") from None


def _refused(exc: AuthzenInputError) -> Exception:
    if exc.too_large:
        return InputTooLarge(exc.message, field=exc.pointer)
    return InvalidInput(exc.message, field=exc.pointer)


def _check_subjects(evaluations: tuple[Evaluation, ...], identity: Identity) -> None:
    """Refuse a body that names another subject than the caller (module docstring)."""
    for evaluation in evaluations:
        if evaluation.subject_id != identity.subject:
            raise NotPermitted(
                f"the subject is the authenticated caller: {evaluation.subject_at} names "
                f"{ascii(evaluation.subject_id)[:200]}, the bearer token "
                f"{ascii(identity.subject)[:200]}", field=evaluation.subject_at)


def _decide(evaluation: Evaluation, identity: Identity) -> Result:
    pdp = current_pdp()
    response = decide_as(pdp.service, identity, evaluation.request, pdp.environment)
    return response.results[0]


@require_identity()
def authzen_evaluation() -> FlaskResponse:
    """AuthZEN Access Evaluation: may the caller do this action on this resource?
    The subject must be the caller; Permit is `true`, anything else `false` with a reason.
    Obligations and advice come in `context`.
    ---
    post:
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: '#/components/schemas/AuthzenEvaluation'}
      responses:
        200:
          description: the decision
          content:
            application/json:
              schema: {$ref: '#/components/schemas/AuthzenDecision'}
        400:
          description: a body that is not an Access Evaluation request (`field` says where)
        403:
          description: the body names another subject than the caller
        415:
          description: not application/json
    """
    try:
        evaluation = parse_evaluation(_body())
    except AuthzenInputError as exc:
        raise _refused(exc) from None
    identity = current_identity()
    _check_subjects((evaluation,), identity)
    return jsonify(decision_json(_decide(evaluation, identity)))


@require_identity()
def authzen_evaluations() -> FlaskResponse:
    """AuthZEN Access Evaluations: several evaluations in one request, in order.
    Top-level subject, action, resource and context are defaults for each evaluation;
    `options.evaluations_semantic` is execute_all (the default), deny_on_first_deny or
    permit_on_first_permit (the answer stops after the first false, or the first true).
    Without `evaluations` (or with an empty array) it is one Access Evaluation.
    ---
    post:
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: '#/components/schemas/AuthzenEvaluations'}
      responses:
        200:
          description: the decisions, in the order of the evaluations
          content:
            application/json:
              schema: {$ref: '#/components/schemas/AuthzenEvaluationsResponse'}
        400:
          description: a body that is not an Access Evaluations request (`field` says where)
        403:
          description: an evaluation names another subject than the caller
        413:
          description: more evaluations than one request may hold
        415:
          description: not application/json
    """
    try:
        batch: Batch = parse_evaluations(_body())
    except AuthzenInputError as exc:
        raise _refused(exc) from None
    identity = current_identity()
    _check_subjects(batch.evaluations, identity)
    if batch.single:
        return jsonify(decision_json(_decide(batch.evaluations[0], identity)))
    return jsonify(evaluations_json(run_batch(batch, lambda e: _decide(e, identity))))


def authzen_configuration() -> FlaskResponse:
    """AuthZEN Policy Decision Point metadata: where the evaluation endpoints are.
    ---
    get:
      security: []
      responses:
        200:
          description: the metadata document
          content:
            application/json:
              schema: {$ref: '#/components/schemas/AuthzenConfiguration'}
    """
    base = (current_pdp().base_url or request.host_url).rstrip("/")
    response = jsonify({"policy_decision_point": base,
                        "access_evaluation_endpoint": base + EVALUATION_PATH,
                        "access_evaluations_endpoint": base + EVALUATIONS_PATH})
    response.headers["Cache-Control"] = "max-age=300"
    return response


def echo_request_id(response: FlaskResponse) -> FlaskResponse:
    """The AuthZEN routes' answers, refusals included, carry the request's X-Request-ID."""
    if request.endpoint in ENDPOINTS:
        request_id = request.headers.get(REQUEST_ID)
        if request_id is not None and _REQUEST_ID_SHAPE.fullmatch(request_id):
            response.headers[REQUEST_ID] = request_id
    return response


__all__ = ["CONFIGURATION_PATH", "EVALUATIONS_PATH", "EVALUATION_PATH", "authzen_configuration",
           "authzen_evaluation", "authzen_evaluations", "echo_request_id"]
