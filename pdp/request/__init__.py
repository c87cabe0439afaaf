"""XACML 3.0 requests, from XML or the JSON Profile, into one immutable RequestContext.

This package keeps the public names; its modules: `model` (the RequestContext both forms end
in), `xml_form` and `json_form` (the two forms), `parse` (which form a body is in, by media
type) and `binding` (what the gateway, not the client, says: subject, environment, join).

Both formats end in the same model, so the evaluator never knows which one the client used. Values
are parsed into their datatype once, in `model`: a value that does not fit its datatype is a syntax
error of the request (said with where it is), not an evaluation error later on.

Multiple Decision Profile: only the "repeated categories" scheme is supported. A request with two
`Attributes` of the same category asks for one decision per combination; `individuals()` expands
them. MultiRequests and CombinedDecision=true are refused with a processing-error status, which is
what the profile allows a PDP that does not implement them to do.
"""
from __future__ import annotations

from pdp.request.binding import (
    CURRENT_TIME_IDS,
    GATEWAY_ENVIRONMENT_PREFIX,
    GATEWAY_RESOURCE_PREFIX,
    JOIN_WITH,
    bind_environment,
    bind_join,
    bind_subject,
)
from pdp.request.json_form import parse_json_request
from pdp.request.model import (
    CATEGORY_SHORTHANDS,
    DATATYPE_SHORTHANDS,
    MAX_INDIVIDUAL_DECISIONS,
    STRING,
    CategoryInstance,
    Individual,
    RequestAttribute,
    RequestContext,
    UnsupportedRequestError,
    iter_individuals,
    normalize_category,
    normalize_datatype,
)
from pdp.request.parse import JSON_MEDIA_TYPES, XML_MEDIA_TYPES, media_kind, parse_request
from pdp.request.xml_form import XML_ID, parse_xml_request
from pdp.urns import ACCESS_SUBJECT, ACTION, ENVIRONMENT, RESOURCE, XACML_NS

__all__ = [
    "ACCESS_SUBJECT", "ACTION", "CATEGORY_SHORTHANDS", "CURRENT_TIME_IDS", "CategoryInstance",
    "DATATYPE_SHORTHANDS", "ENVIRONMENT", "GATEWAY_ENVIRONMENT_PREFIX",
    "GATEWAY_RESOURCE_PREFIX", "Individual", "JOIN_WITH", "JSON_MEDIA_TYPES",
    "MAX_INDIVIDUAL_DECISIONS", "RESOURCE", "RequestAttribute", "RequestContext", "STRING",
    "UnsupportedRequestError", "XACML_NS", "XML_ID", "XML_MEDIA_TYPES", "bind_environment",
    "bind_join", "bind_subject", "iter_individuals", "media_kind", "normalize_category",
    "normalize_datatype", "parse_json_request", "parse_request", "parse_xml_request",
]
