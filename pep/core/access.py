"""An access request's way from XACML to an execution plan: decide, then plan what is granted.

Shared by `POST /explain` (which stops here) and `POST /requests` (which goes on to open a
handle). The order of the steps is the eXACML+ workflow (section 3.2): parse, bind the
authenticated subject, decide, obligations to a graph, user query to a graph, merge with NR/PR
analysis. Every failure is a `pep.core.errors.Refusal` of the kind that says what went wrong (a
denial carries the XACML response, for the edge to answer in XACML); nothing here starts a query.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pdp import (STATUS_SYNTAX_ERROR, Decision, RequestSyntaxError, Response, Result, Status,
                 bind_environment, bind_subject, media_kind, parse_request)
from pep.core.analysis import ConditionTooComplex, Warning
from pep.core.errors import (AccessDenied, InvalidInput, MalformedRequest, NoResult, NotFound,
                             Refusal, TooComplex, UnsupportedMedia)
from pep.core.explain import graph_to_json, plan_to_json, render_sql
from pep.core.graph import UnsupportedGraph
from pep.core.merge import merge
from pep.core.obligations import ObligationError, policy_graph
from pep.core.plan import ExecutionPlan, StreamSchema
from pep.core.userquery import UserQueryError, parse_user_query, query_from_content, user_graph

RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"

SchemaLookup = Callable[[str], "StreamSchema | None"]


@dataclass
class Grant:
    """A permitted access request, planned: what the consumer will get and why."""

    decision: Response
    stream: str
    subject: str
    plan: ExecutionPlan
    warnings: list[Warning]
    sql: str
    plan_json: dict
    policy_ids: set[str]
    graph_json: dict = field(default_factory=dict)


SUBJECT_ID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
SUBJECT_ROLE = "urn:oasis:names:tc:xacml:2.0:subject:role"
SUBJECT_CATEGORY = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"


ENVIRONMENT_CATEGORY = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
EnvironmentAttributes = list[tuple[str, str, list[str]]]


def caller_resolver(identity, stream: str, environment: EnvironmentAttributes = ()
                    ) -> Callable[[str, str], list[str]]:
    """What a policy's placeholders may stand for: only what the gateway itself vouches for.

    `{subject:...}` is the authenticated caller: subject-id, role, or one of the identity's
    attributes (from the auth file or the token), by its full AttributeId or, when exactly one
    attribute ends so, its last segment. `{resource:resource-id}` is the stream being asked for.
    `{environment:...}` is one of the gateway's own environment attributes (stream events, by
    full id). Nothing else resolves, and nothing is ever read from the request document: a
    request can add, repeat or respell attributes in any category without changing what a
    placeholder becomes.
    """
    subject: list[tuple[str, list[str]]] = [
        (SUBJECT_ID, [identity.subject]), (SUBJECT_ROLE, list(identity.roles))]
    for attribute_id, values in getattr(identity, "attributes", ()):
        subject.append((attribute_id, [_lexical(v) for v in values]))
    by_category = {SUBJECT_CATEGORY: subject, RESOURCE: [(RESOURCE_ID, [stream])],
                   ENVIRONMENT_CATEGORY: [(a, list(v)) for a, _, v in environment]}

    def resolve(category: str, attribute: str) -> list[str]:
        known = by_category.get(category, [])
        exact = [values for name, values in known if name == attribute]
        if exact:
            return exact[0]
        if category == ENVIRONMENT_CATEGORY:
            return []  # the gateway's environment attributes are named in full
        short = [values for name, values in known if name.rsplit(":", 1)[-1] == attribute]
        if len(short) > 1:
            raise ObligationError(f"placeholder {attribute!r} is ambiguous: several of the "
                                  "caller's attributes end so; write the full AttributeId")
        return short[0] if short else []

    return resolve


def _lexical(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _deny(reason: str, media_type: str) -> AccessDenied:
    response = Response((Result(Decision.DENY, Status(message=reason)),))
    return AccessDenied(reason, response, media_type)


def decide_and_plan(engine, body: bytes, media_type: str, identity, schema_lookup: SchemaLookup,
                    user_query: bytes | None = None, user_query_type: str | None = None, *,
                    refuse_nr: bool = True,
                    time_attribute_lookup: Callable[[str], str | None] | None = None,
                    environment: Callable[[], EnvironmentAttributes] | None = None) -> Grant:
    """Decide and plan one stream request; raises a Refusal saying why on any failure.
    `environment()` gives the gateway's own environment attributes (stream events)."""
    try:
        media_kind(media_type)
    except RequestSyntaxError as exc:
        raise UnsupportedMedia(str(exc)) from None
    try:
        ctx = parse_request(body, media_type)
    except RequestSyntaxError as exc:
        status = Status(code=getattr(exc, "status_code", STATUS_SYNTAX_ERROR), message=str(exc))
        response = Response((Result(Decision.INDETERMINATE, status),))
        raise MalformedRequest(str(exc), response, media_type) from None
    ctx = bind_subject(ctx, identity)
    gateway_environment = environment() if environment is not None else []
    ctx = bind_environment(ctx, gateway_environment)

    streams = list(dict.fromkeys(ctx.values(RESOURCE, RESOURCE_ID)))
    if not streams:
        raise InvalidInput(f"the request names no stream: give the resource attribute "
                           f"{RESOURCE_ID}")
    if len(streams) > 1:
        raise InvalidInput(f"the request names {len(streams)} streams ({', '.join(streams)}); "
                           "a stream request is for exactly one")
    stream = streams[0]
    schema = schema_lookup(stream)
    if schema is None:
        raise NotFound(f"unknown stream {stream!r}", stream=stream)

    try:
        return _plan(engine, ctx, stream, schema, identity, media_type, user_query,
                     user_query_type, refuse_nr, time_attribute_lookup, gateway_environment)
    except Refusal as exc:
        exc.details.setdefault("stream", stream)  # for the audit trail and the error body
        raise


def _plan(engine, ctx, stream: str, schema: StreamSchema, identity, media_type: str,
          user_query: bytes | None, user_query_type: str | None, refuse_nr: bool,
          time_attribute_lookup: Callable[[str], str | None] | None,
          gateway_environment: EnvironmentAttributes) -> Grant:
    response, traces = engine.decide_with_trace(ctx)
    if len(response.results) != 1:
        raise InvalidInput(f"the request asks for {len(response.results)} decisions (Multiple "
                           "Decision Profile); a stream request must ask for exactly one")
    result = response.results[0]
    if result.decision is not Decision.PERMIT:
        reason = result.status.message or f"decision is {result.decision.value}"
        raise AccessDenied(f"access denied: {reason}", response, media_type)
    policy_ids: set[str] = set().union(*traces) if traces else set()

    try:
        policy = policy_graph(result.obligations, stream, schema,
                              resolver=caller_resolver(identity, stream, gateway_environment))
    except ObligationError as exc:
        raise _deny(f"obligation cannot be fulfilled: {exc.message}", media_type) from None

    content = ctx.content(RESOURCE)
    if content is not None and user_query is not None:
        raise InvalidInput("two user queries: one in the request's resource Content and one "
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
        raise InvalidInput(f"user query: {exc.message}", position=exc.position) from None

    time_attribute = time_attribute_lookup(stream) if time_attribute_lookup else None
    try:
        merged = merge(policy, user, schema, time_attribute=time_attribute)
    except ConditionTooComplex as exc:
        raise TooComplex(str(exc)) from None
    except UnsupportedGraph as exc:
        raise InvalidInput(str(exc)) from None

    warnings = list(merged.warnings)
    if refuse_nr and merged.nr:
        nr = [w for w in warnings if w.kind == "NR"]
        raise NoResult("no result: " + nr[0].message, warnings=[w.to_json() for w in warnings])
    return Grant(
        decision=response, stream=stream, subject=identity.subject, plan=merged.plan,
        warnings=warnings, sql=render_sql(merged.plan, schema), plan_json=plan_to_json(merged.plan),
        policy_ids=policy_ids, graph_json=graph_to_json(merged.graph, schema))


def decision_name(decision: object) -> str:
    """'Permit', 'Deny', ... from a Decision or from a one-result XACML Response."""
    results = getattr(decision, "results", None)
    if results is not None:
        if len(results) != 1:
            return "Indeterminate"
        decision = results[0].decision
    return str(getattr(decision, "value", decision))


__all__ = ["Grant", "decide_and_plan", "caller_resolver", "decision_name", "SchemaLookup",
           "RESOURCE", "RESOURCE_ID"]
