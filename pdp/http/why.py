"""`POST /pdp?explain=1`: the decision and why it came out so (`pdp.why`), for who asks.

The request is decided as the authenticated caller, exactly as `POST /pdp` decides it (the same
binding of the subject and of the gateway's environment), then explained. What the caller sees
of the explanation depends on who it is:

- an administrator: everything (every policy, rule and Match evaluated, the combining
  algorithms' steps, each obligation's origin, the attributes read and missing);
- a caller who manages some of the policies that took part (a stream owner): those policies in
  full; of every other one only how many gave which decision, never its id, rules, attributes
  or what it contributed;
- anyone else (a consumer): the decision and which of its own (subject) attributes the policies
  read and it does not have; nothing of any policy.

The answer is JSON: `{"response": <the XACML response, JSON Profile>, "explanations": [one per
individual decision]}`.
"""
from __future__ import annotations

import json
from typing import Any

from flask import Response as FlaskResponse, jsonify, request

from common.auth import Identity
from pdp.http.context import PdpRoutes
from pdp.request import RequestContext
from pdp.response import render_response
from pdp.why import Explanation, explanation_json

EXPLAIN_PARAMETER = "explain"


def explain_asked() -> bool:
    """Whether the request's query asks for an explanation (`?explain=1`, `true`, `yes`)."""
    return request.args.get(EXPLAIN_PARAMETER, "").strip().lower() in ("1", "true", "yes")


def explained(pdp: PdpRoutes, identity: Identity, ctx: RequestContext) -> FlaskResponse:
    """The decision of a request already bound to the caller, with its explanations."""
    response, explanations = pdp.service.engine.explain(ctx)
    rendered = json.loads(render_response(response, "application/xacml+json"))
    views = [explanation_view(pdp, identity, e) for e in explanations]
    return jsonify({"response": rendered, "explanations": views})


def explanation_view(pdp: PdpRoutes, identity: Identity, expl: Explanation) -> dict[str, Any]:
    """The part of an explanation this caller may see (see the module docstring)."""
    if identity.admin:
        return explanation_json(expl)
    judged: dict[str, bool] = {}

    def mine(doc: str) -> bool:
        if doc not in judged:
            info = pdp.existing_info(doc)
            judged[doc] = bool(info is not None and pdp.may_manage(identity, info))
        return judged[doc]

    docs = {n.doc for n in expl.nodes() if n.doc is not None}
    if any(mine(doc) for doc in docs):
        return explanation_json(expl, mine=mine)
    return explanation_json(expl, consumer=True)


__all__ = ["explain_asked", "explained", "explanation_view", "EXPLAIN_PARAMETER"]
