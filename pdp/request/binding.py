"""What the gateway, not the client, says in a request: the access subject (who authenticated),
the environment's clock and `urn:xsg:` attributes, and the stream a request is joined with."""
from __future__ import annotations

from collections.abc import Sequence

from common.auth import AttributeValue, Identity
from pdp.request.model import (
    DATATYPE_SHORTHANDS,
    STRING,
    CategoryInstance,
    RequestAttribute,
    RequestContext,
)
from pdp.urns import (
    ACCESS_SUBJECT,
    CURRENT_DATE,
    CURRENT_DATETIME,
    CURRENT_TIME,
    ENVIRONMENT,
    RESOURCE,
    SUBJECT_ID,
    SUBJECT_ROLE,
)


def bind_subject(ctx: RequestContext, identity: Identity) -> RequestContext:
    """The request as it is decided: the access subject is the authenticated caller.

    Every access-subject attribute the request brought is dropped (under any id, datatype or
    issuer, in every repeated access-subject element, which collapse into one), and the
    category holds exactly what the gateway knows of the caller: subject-id, roles, and the
    identity's other attributes (`identity.attributes`). Nothing a request claims about its
    subject reaches a decision or an obligation."""
    attributes = [RequestAttribute(SUBJECT_ID, STRING, (identity.subject,)),
                  RequestAttribute(SUBJECT_ROLE, STRING, tuple(identity.roles))]
    for attribute_id, values in getattr(identity, "attributes", ()):
        datatype, lexical = _identity_values(values)
        attributes.append(RequestAttribute(attribute_id, datatype, lexical))
    others = [inst for inst in ctx.instances if inst.category != ACCESS_SUBJECT]
    subject = CategoryInstance.build(ACCESS_SUBJECT, attributes)
    return RequestContext([subject, *others], ctx.return_policy_id_list, ctx.combined_decision)


CURRENT_TIME_IDS = frozenset({CURRENT_TIME, CURRENT_DATE, CURRENT_DATETIME})
GATEWAY_ENVIRONMENT_PREFIX = "urn:xsg:"


def bind_environment(ctx: RequestContext,
                     attributes: Sequence[tuple[str, str, Sequence[str]]] = ()) -> RequestContext:
    """The request as it is decided: the environment's clock and the gateway's own environment
    attributes are the gateway's, whatever the request claimed.

    Dropped from the request: current-time, current-date and current-dateTime (the PDP then
    reads its own clock) and every attribute under `urn:xsg:`; added: `attributes`, as
    (attribute id, datatype, lexical values), e.g. the state of stream events."""
    if any(inst.category == ENVIRONMENT and any(_gateway_environment(a.attribute_id)
                                                for a in inst.attributes)
           for inst in ctx.instances):
        kept = []
        for inst in ctx.instances:
            if inst.category == ENVIRONMENT:
                attrs = [a for a in inst.attributes if not _gateway_environment(a.attribute_id)]
                inst = CategoryInstance.build(ENVIRONMENT, attrs, inst.content, inst.xml_id)
            kept.append(inst)
        ctx = RequestContext(kept, ctx.return_policy_id_list, ctx.combined_decision)
    # else nothing to drop: `ctx` as it is (contexts are never changed, only copied)
    for attribute_id, datatype, values in attributes:
        ctx = ctx.with_attribute(ENVIRONMENT, attribute_id, datatype, list(values))
    return ctx


def _gateway_environment(attribute_id: str) -> bool:
    return (attribute_id in CURRENT_TIME_IDS
            or attribute_id.startswith(GATEWAY_ENVIRONMENT_PREFIX))


JOIN_WITH = "urn:xsg:resource:join-with"
GATEWAY_RESOURCE_PREFIX = "urn:xsg:"


def bind_join(ctx: RequestContext, other: str | None = None) -> RequestContext:
    """The request as it is decided: which stream it is joined with is the gateway's to say.

    Dropped from the request: every resource attribute under `urn:xsg:` (a request for a stream
    alone could otherwise claim to be part of a join and meet a grant given only for joins);
    added, when the request is one side of a join: `urn:xsg:resource:join-with`, the other
    stream's name. A policy grants a stream only in a join with another by matching it."""
    if any(inst.category == RESOURCE and any(a.attribute_id.startswith(GATEWAY_RESOURCE_PREFIX)
                                             for a in inst.attributes)
           for inst in ctx.instances):
        kept = []
        for inst in ctx.instances:
            if inst.category == RESOURCE:
                attrs = [a for a in inst.attributes
                         if not a.attribute_id.startswith(GATEWAY_RESOURCE_PREFIX)]
                inst = CategoryInstance.build(RESOURCE, attrs, inst.content, inst.xml_id)
            kept.append(inst)
        ctx = RequestContext(kept, ctx.return_policy_id_list, ctx.combined_decision)
    # else nothing to drop: `ctx` as it is (a revocation pass binds a thousand requests)
    if other is not None:
        ctx = ctx.with_attribute(RESOURCE, JOIN_WITH, STRING, [other])
    return ctx


def _identity_values(values: Sequence[AttributeValue]) -> tuple[str, tuple[str, ...]]:
    """XACML datatype and lexical forms of an identity attribute's values (one Python type)."""
    first = values[0] if values else ""
    if isinstance(first, bool):
        return DATATYPE_SHORTHANDS["boolean"], tuple("true" if v else "false" for v in values)
    if isinstance(first, int):
        return DATATYPE_SHORTHANDS["integer"], tuple(str(int(v)) for v in values)
    if isinstance(first, float):
        return DATATYPE_SHORTHANDS["double"], tuple(repr(float(v)) for v in values)
    return STRING, tuple(str(v) for v in values)
