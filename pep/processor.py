"""The request processor: from an HTTP body to a decided, merged and analysed plan.

Shared by `POST /explain` (which stops here) and the stream request endpoint (which goes on to
book a window slot and start the plan). The order of the steps is the eXACML+ workflow (section
3.2): parse, bind the authenticated subject, decide, obligations to a graph, user query to a
graph, merge with NR/PR analysis. Every failure is a `Refused` carrying the HTTP status and a
body that says why; nothing here starts a query.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pep.analysis import ConditionTooComplex, Warning
from pep.explain import graph_to_json, plan_to_json, render_sql
from pep.graph import UnsupportedGraph
from pep.merge import QueryRefused, merge
from pep.obligations import ObligationError, policy_graph
from pep.plan import ExecutionPlan, StreamSchema
from pep.userquery import UserQueryError, parse_user_query, query_from_content, user_graph
from pdp.errors import RequestSyntaxError
from pdp.request import RequestContext, media_kind, parse_request
from pdp.request import bind_subject as bind_identity
from pdp.response import render_response
from pdp.results import (STATUS_SYNTAX_ERROR, Decision, Response, Result, Status)

RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
XACML_MEDIA = {"xml": "application/xacml+xml", "json": "application/xacml+json"}

SchemaLookup = Callable[[str], "StreamSchema | None"]


@dataclass
class Prepared:
    decision: Response
    stream: str
    subject: str
    plan: ExecutionPlan
    warnings: list[Warning]
    sql: str
    plan_json: dict
    policy_ids: set[str]
    graph_json: dict = field(default_factory=dict)


class Refused(Exception):
    """The request cannot go on; `status`, `body` and `content_type` are the HTTP answer."""

    def __init__(self, status: int, message: str, body: bytes | None = None,
                 content_type: str = "application/json", **extra: Any) -> None:
        self.status = status
        self.message = message
        if body is None:
            body = json.dumps({"error": message, **extra}, ensure_ascii=False).encode("utf-8")
        self.body = body
        self.content_type = content_type
        super().__init__(message)


def request_resolver(ctx: RequestContext) -> Callable[[str, str], list[str]]:
    """Placeholder lookup: a full AttributeId, or a short name matching its last ':' segment."""

    def resolve(category: str, attribute: str) -> list[str]:
        exact: list[str] = []
        short: list[str] = []
        for inst in ctx.instances:
            if inst.category != category:
                continue
            for attr in inst.attributes:
                if attr.attribute_id == attribute:
                    exact.extend(attr.values)
                elif attr.attribute_id.rsplit(":", 1)[-1] == attribute:
                    short.extend(attr.values)
        return exact or short

    return resolve


def _xacml_refusal(status: int, message: str, response: Response, media_type: str) -> Refused:
    kind = media_kind(media_type)
    return Refused(status, message, render_response(response, XACML_MEDIA[kind]), XACML_MEDIA[kind])


def _deny(reason: str, media_type: str) -> Refused:
    response = Response((Result(Decision.DENY, Status(message=reason)),))
    return _xacml_refusal(403, reason, response, media_type)


def prepare(engine, body: bytes, media_type: str, identity, schema_lookup: SchemaLookup,
            user_query: bytes | None = None, user_query_type: str | None = None, *,
            refuse_nr: bool = True, time_attribute_lookup: Callable[[str], str | None] | None = None
            ) -> Prepared:
    """Decide and plan one stream request; raises Refused with the HTTP answer on any failure."""
    try:
        kind = media_kind(media_type)
    except RequestSyntaxError as exc:
        raise Refused(415, str(exc)) from None
    try:
        ctx = parse_request(body, media_type)
    except RequestSyntaxError as exc:
        status = Status(code=getattr(exc, "status_code", STATUS_SYNTAX_ERROR), message=str(exc))
        response = Response((Result(Decision.INDETERMINATE, status),))
        raise _xacml_refusal(400, str(exc), response, media_type) from None
    ctx = bind_identity(ctx, identity)

    streams = list(dict.fromkeys(ctx.values(RESOURCE, RESOURCE_ID)))
    if not streams:
        raise Refused(400, f"the request names no stream: give the resource attribute {RESOURCE_ID}")
    if len(streams) > 1:
        raise Refused(400, f"the request names {len(streams)} streams ({', '.join(streams)}); "
                           "a stream request is for exactly one")
    stream = streams[0]
    schema = schema_lookup(stream)
    if schema is None:
        raise Refused(404, f"unknown stream {stream!r}", stream=stream)

    response, traces = engine.decide_with_trace(ctx)
    if len(response.results) != 1:
        raise Refused(400, f"the request asks for {len(response.results)} decisions (Multiple "
                           "Decision Profile); a stream request must ask for exactly one")
    result = response.results[0]
    if result.decision is not Decision.PERMIT:
        reason = result.status.message or f"decision is {result.decision.value}"
        raise _xacml_refusal(403, f"access denied: {reason}", response, media_type)
    policy_ids: set[str] = set().union(*traces) if traces else set()

    try:
        policy = policy_graph(result.obligations, stream, schema, resolver=request_resolver(ctx))
    except ObligationError as exc:
        raise _deny(f"obligation cannot be fulfilled: {exc.message}", media_type) from None

    content = ctx.content(RESOURCE)
    if content is not None and user_query is not None:
        raise Refused(400, "two user queries: one in the request's resource Content and one "
                           "beside it; send only one")
    user = None
    try:
        if content is not None:
            query = query_from_content(content)
        elif user_query is not None:
            query = parse_user_query(user_query, user_query_type)
        else:
            query = None
        if query is not None:
            user = user_graph(query, stream, schema)
    except UserQueryError as exc:
        raise Refused(400, f"user query: {exc.message}", position=exc.position) from None

    time_attribute = time_attribute_lookup(stream) if time_attribute_lookup else None
    try:
        merged = merge(policy, user, schema, time_attribute=time_attribute)
    except QueryRefused as exc:
        raise Refused(exc.status, exc.message, attribute=exc.attribute) from None
    except ConditionTooComplex as exc:
        raise Refused(422, str(exc)) from None
    except UnsupportedGraph as exc:
        raise Refused(400, str(exc)) from None

    warnings = list(merged.warnings)
    if refuse_nr and merged.nr:
        nr = [w for w in warnings if w.kind == "NR"]
        raise Refused(422, "no result: " + nr[0].message,
                      warnings=[w.to_json() for w in warnings])
    return Prepared(
        decision=response, stream=stream, subject=identity.subject, plan=merged.plan,
        warnings=warnings, sql=render_sql(merged.plan, schema), plan_json=plan_to_json(merged.plan),
        policy_ids=policy_ids, graph_json=graph_to_json(merged.graph, schema))
