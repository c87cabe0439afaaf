"""`POST /explain`: what a stream request would get, without starting anything.

Same body and Content-Type as a stream request (XACML XML or JSON, the user query in the
resource Content). Answers JSON {decision, warnings, plan, sql, graph, policies}; a denial is 403
with the XACML response; other refusals carry their status and a JSON error. An NR finding is
shown (200 with the warning) rather than refused, since explaining is the point.
"""
from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, Response as FlaskResponse, jsonify, request

from pdp.auth import current_identity, require_identity
from pep.processor import Refused, SchemaLookup, prepare


def explain_blueprint(get_engine: Callable[[], object], schema_lookup: SchemaLookup) -> Blueprint:
    bp = Blueprint("explain", __name__)

    @bp.post("/explain")
    @require_identity()
    def explain():
        content_type = request.headers.get("Content-Type", "")
        engine = get_engine()
        if engine is None:
            response = jsonify(error="policy engine not loaded")
            response.status_code = 503
            return response
        try:
            prepared = prepare(engine, request.get_data(cache=False), content_type,
                               current_identity(), schema_lookup, refuse_nr=False)
        except Refused as exc:
            return FlaskResponse(exc.body, status=exc.status, content_type=exc.content_type)
        result = prepared.decision.results[0]
        return jsonify(
            decision=result.decision.value,
            stream=prepared.stream,
            warnings=[w.to_json() for w in prepared.warnings],
            plan=prepared.plan_json,
            sql=prepared.sql,
            graph=prepared.graph_json,
            policies=sorted(prepared.policy_ids),
        )

    return bp
