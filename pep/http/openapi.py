"""The API described from the code: `GET /openapi.json` (OpenAPI 3) and the XACML REST home
document at `GET /`.

The OpenAPI document is generated at request time from the app's routes (apispec): every rule
and method of the app is a path and an operation; a view's docstring gives the summary (first
line) and description, and, after a `---` line, YAML with the operation's details (request body
media types, responses) where a view declares them. Nothing is kept beside the code, so a route
cannot be added without appearing here; `tests/pep/http/test_openapi.py` checks the document
against the live routes and validates it.

The home document follows the XACML REST Profile (section 2.2): the PDP's link relation
`http://docs.oasis-open.org/ns/xacml/relation/pdp` points at `/pdp`, as JSON Home
(`application/json-home`, also for `application/json`) or as XML (`application/xml`), by Accept.
"""
from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from apispec import APISpec
from apispec.yaml_utils import load_operations_from_docstring
from flask import Blueprint, Flask, Response, current_app, jsonify, request

from common.http.errors import error_response

PDP_RELATION = "http://docs.oasis-open.org/ns/xacml/relation/pdp"
HOME_NS = "http://ietf.org/ns/home-documents"
METHODS = ("get", "post", "put", "patch", "delete")
_CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")
_TYPES = {"int": "integer", "float": "number"}
ERROR = {"description": "refused: the error body (`error`, `status` and what went wrong where)",
         "content": {"application/problem+json": {
             "schema": {"$ref": "#/components/schemas/Error"}}}}


# Request documents that several views name (`$ref: '#/components/schemas/<name>'` in their
# docstrings). They say what a route reads, so that a client, or a property-based run of the
# whole API (tests/pep/http/test_no_500.py), can reach past the first check.
SCHEMAS: dict[str, dict[str, Any]] = {
    "XacmlXml": {"type": "string", "description": "a XACML 3.0 document (XML)"},
    "XacmlJson": {"type": "object", "description": "a XACML 3.0 request, JSON Profile",
                  "properties": {"Request": {"type": "object"}}},
    "StreamRegistration": {
        "type": "object", "required": ["name", "schema"],
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_-]{0,63}$"},
            "time_attribute": {"type": "string"},
            "schema": {"type": "array", "items": {
                "type": "object", "required": ["name", "type"],
                "properties": {"name": {"type": "string"},
                               "type": {"type": "string", "enum": [
                                   "double", "long", "string", "boolean", "timestamp"]}}}},
            "source": {"type": "object", "required": ["kind"],
                       "properties": {"kind": {"type": "string", "enum": [
                           "ingest", "files", "generator", "socket", "kafka"]}},
                       "additionalProperties": True}}},
    "EventDefinition": {
        "type": "object", "required": ["name", "condition"],
        "properties": {"name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_-]{0,63}$"},
                       "condition": {"type": "string"},
                       "hold": {"type": "number", "description": "seconds, (0, 604800]"},
                       "key": {"type": "string"}}},
    "Webhook": {"type": "object", "required": ["webhook"],
                "properties": {"webhook": {"type": "string", "format": "uri"}}},
    # AuthZEN Authorization API 1.0 (pdp/authzen.py has the mapping to XACML)
    "AuthzenSubject": {"type": "object", "required": ["type", "id"], "properties": {
        "type": {"type": "string"},
        "id": {"type": "string", "description": "the authenticated caller's subject"},
        "properties": {"type": "object"}}},
    "AuthzenResource": {"type": "object", "required": ["type", "id"], "properties": {
        "type": {"type": "string"}, "id": {"type": "string"},
        "properties": {"type": "object"}}},
    "AuthzenAction": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "properties": {"type": "object"}}},
    "AuthzenEvaluation": {
        "type": "object", "required": ["subject", "resource", "action"], "properties": {
            "subject": {"$ref": "#/components/schemas/AuthzenSubject"},
            "resource": {"$ref": "#/components/schemas/AuthzenResource"},
            "action": {"$ref": "#/components/schemas/AuthzenAction"},
            "context": {"type": "object"}}},
    "AuthzenEvaluations": {"type": "object", "properties": {
        "subject": {"$ref": "#/components/schemas/AuthzenSubject"},
        "resource": {"$ref": "#/components/schemas/AuthzenResource"},
        "action": {"$ref": "#/components/schemas/AuthzenAction"},
        "context": {"type": "object"},
        "evaluations": {"type": "array", "maxItems": 1000, "items": {
            "type": "object", "properties": {
                "subject": {"$ref": "#/components/schemas/AuthzenSubject"},
                "resource": {"$ref": "#/components/schemas/AuthzenResource"},
                "action": {"$ref": "#/components/schemas/AuthzenAction"},
                "context": {"type": "object"}}}},
        "options": {"type": "object", "properties": {"evaluations_semantic": {
            "type": "string",
            "enum": ["execute_all", "deny_on_first_deny", "permit_on_first_permit"]}}}}},
    "AuthzenDecision": {"type": "object", "required": ["decision"], "properties": {
        "decision": {"type": "boolean"},
        "context": {"type": "object", "description": "reason and xacml_decision when false; "
                                                     "obligations and advice; the XACML "
                                                     "status of an Indeterminate"}}},
    "AuthzenEvaluationsResponse": {"type": "object", "properties": {
        "decision": {"type": "boolean"}, "context": {"type": "object"},
        "evaluations": {"type": "array",
                        "items": {"$ref": "#/components/schemas/AuthzenDecision"}}}},
    "AuthzenConfiguration": {
        "type": "object", "required": ["policy_decision_point", "access_evaluation_endpoint"],
        "properties": {"policy_decision_point": {"type": "string", "format": "uri"},
                       "access_evaluation_endpoint": {"type": "string", "format": "uri"},
                       "access_evaluations_endpoint": {"type": "string", "format": "uri"}}},
}


def _version() -> str:
    try:
        return version("xsg")
    except PackageNotFoundError:  # pragma: no cover - a source tree without an install
        return "0"


def _summary(view: Any) -> tuple[str, str]:
    doc = (view.__doc__ or "").split("\n---", 1)[0].strip()
    if not doc:
        return view.__name__.replace("_", " "), ""
    first, _, rest = doc.partition("\n")
    return first.strip(), " ".join(rest.split())


def build_openapi(app: Flask) -> dict[str, Any]:
    spec = APISpec(title="xsg gateway", version=_version(), openapi_version="3.0.3", info={
        "description": "XACML decision and enforcement gateway for live data streams."})
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer"})
    spec.components.schema("Error", {"type": "object", "required": ["error", "status"],
                                     "properties": {"error": {"type": "string"},
                                                    "status": {"type": "integer"}},
                                     "additionalProperties": True})
    for name, schema in SCHEMAS.items():
        spec.components.schema(name, schema)
    paths: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.rule.startswith("/console/static"):
            continue
        view = app.view_functions[rule.endpoint]
        path = _CONVERTER.sub(lambda m: "{" + m.group(2) + "}", rule.rule)
        declared = load_operations_from_docstring(view.__doc__ or "")
        summary, description = _summary(view)
        parameters = [{"name": name, "in": "path", "required": True,
                       "schema": {"type": _TYPES.get(conv or "", "string")}}
                      for conv, name in _CONVERTER.findall(rule.rule)]
        for method in sorted(m.lower() for m in rule.methods or ()):
            if method not in METHODS:
                continue
            operation = dict(declared.get(method, {}))
            operation.setdefault("summary", summary)
            if description:
                operation.setdefault("description", description)
            operation_id = f"{rule.endpoint}.{method}"
            while operation_id in used:  # one view on several rules (/console and /console/)
                operation_id += "_"
            used.add(operation_id)
            operation.setdefault("operationId", operation_id)
            responses = operation.setdefault("responses", {})
            responses.setdefault("default", ERROR)
            if not any(str(code).startswith("2") for code in responses):
                responses["200"] = {"description": "done"}
            declared_parameters = list(operation.get("parameters", ()))
            named = {(p.get("name"), p.get("in")) for p in declared_parameters}
            merged = [p for p in parameters if (p["name"], "path") not in named]
            if merged or declared_parameters:  # the path's own, then what the view declares
                operation["parameters"] = merged + declared_parameters
            paths.setdefault(path, {})[method] = operation
    for path, operations in sorted(paths.items()):
        spec.path(path=path, operations=operations)
    doc = spec.to_dict()
    doc["security"] = [{"bearer": []}]
    return doc


# Defined once, at module level: both routes read only the app serving the request.
bp = Blueprint("xsg_openapi", __name__)


@bp.get("/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3 description of every route of this gateway.
    ---
    get:
      security: []
      responses:
        200:
          description: the OpenAPI document
          content:
            application/json: {}
    """
    return jsonify(build_openapi(current_app))


@bp.get("/")
def home() -> Response:
    """The XACML REST Profile home document: where the PDP is.
    ---
    get:
      security: []
      responses:
        200:
          description: the home document (JSON Home or XML, by Accept)
          content:
            application/json-home: {}
            application/xml: {}
    """
    best = (request.accept_mimetypes.best_match(
        ["application/json-home", "application/json", "application/xml"])
        if request.headers.get("Accept") else "application/json-home")
    base = request.script_root
    if best is None:
        return error_response(406, "the home document is application/json-home, "
                                   "application/json or application/xml")
    if best == "application/xml":
        xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<resources xmlns="{HOME_NS}">'
               f'<resource rel="{PDP_RELATION}"><link href="{base}/pdp"/></resource>'
               "</resources>\n")
        return Response(xml, content_type="application/xml")
    body = {"resources": {PDP_RELATION: {"href": f"{base}/pdp"},
                          "urn:xsg:relation:openapi": {"href": f"{base}/openapi.json"},
                          "urn:xsg:relation:console": {"href": f"{base}/console"}}}
    response = jsonify(body)
    response.content_type = best
    return response


def create_openapi_blueprint() -> Blueprint:
    """GET / and GET /openapi.json (one Blueprint, registered on every gateway app)."""
    return bp


__all__ = ["build_openapi", "create_openapi_blueprint", "PDP_RELATION"]
