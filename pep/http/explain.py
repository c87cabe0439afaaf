"""`POST /explain`: what a stream request would get, without starting anything.

Same body and Content-Type as a stream request (XACML XML or JSON, the user query in the
resource Content). Answers JSON {decision, stream, warnings, plan, sql, graph, policies}, and
for a differentially private window `privacy`: the caller's budgets on the stream now (spent,
remaining, windows affordable, when it refills) and whether a request would be admitted; a
denial is 403 with the XACML response; other refusals go through the error table. An NR finding
is shown (200 with the warning) rather than refused, since explaining is the point.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request

from common.http.auth import current_identity, require_identity
from pep.core.access import SchemaLookup, decide_and_plan as default_decide_and_plan
from pep.core.plan import AnyPlan

EXPLAIN_EXTENSION = "xsg.explain"
# (subject, plan) -> the caller's privacy budgets for a private plan, as explain shows them
PrivacyStatusOf = Callable[[str, AnyPlan], Mapping[str, object] | None]


@dataclass(frozen=True)
class ExplainRoutes:
    """What `POST /explain` works with, kept on the app that serves it (`install_explain`):
    the policy engine of the moment, the schemas the caller may see, the deciding and planning
    of a stream request, and `privacy_status(subject, plan)`, the caller's privacy budgets for
    a private plan (None: no budgets to report)."""

    get_engine: Callable[[], Any]
    schema_lookup: SchemaLookup
    decide_and_plan: Callable[..., Any] = default_decide_and_plan
    privacy_status: PrivacyStatusOf | None = None


def install_explain(app: Flask, get_engine: Callable[[], Any], schema_lookup: SchemaLookup,
                    decide_and_plan: Callable[..., Any] = default_decide_and_plan,
                    privacy_status: PrivacyStatusOf | None = None
                    ) -> None:
    """`POST /explain` on `app`, over these (see `ExplainRoutes`)."""
    app.extensions[EXPLAIN_EXTENSION] = ExplainRoutes(get_engine, schema_lookup, decide_and_plan,
                                                      privacy_status)
    app.register_blueprint(bp)


def explain_routes() -> ExplainRoutes:
    """The `ExplainRoutes` of the app serving the current request."""
    routes: ExplainRoutes = current_app.extensions[EXPLAIN_EXTENSION]
    return routes


# Defined once, at module level: the route reads the app's `ExplainRoutes`, so any app that
# carries them serves it.
bp = Blueprint("explain", __name__)


@bp.post("/explain")
@require_identity()
def explain() -> Response:
    """Decide and plan a stream request without opening a handle: the plan, SQL and graph.
    ---
    post:
      requestBody:
        required: true
        content:
          application/xacml+xml:
            schema: {$ref: '#/components/schemas/XacmlXml'}
          application/xacml+json:
            schema: {$ref: '#/components/schemas/XacmlJson'}
    """
    routes = explain_routes()
    grant = routes.decide_and_plan(routes.get_engine(), request.get_data(cache=False),
                                   request.headers.get("Content-Type", ""), current_identity(),
                                   routes.schema_lookup, refuse_nr=False,
                                   explain_missing_action=True)
    privacy = (routes.privacy_status(current_identity().subject, grant.plan)
               if routes.privacy_status is not None else None)
    return jsonify(
        decision=grant.decision.results[0].decision.value,
        stream=grant.stream,
        warnings=[w.to_json() for w in grant.warnings],
        plan=grant.plan_json,
        sql=grant.sql,
        graph=grant.graph_json,
        policies=sorted(grant.policy_ids),
        **({"privacy": privacy} if privacy is not None else {}),
    )


__all__ = ["bp", "install_explain", "explain_routes", "ExplainRoutes", "explain"]
