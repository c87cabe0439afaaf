"""`GET /metrics`: the gateway's metrics in the Prometheus text format (see pep/metrics.py).

An administrator's bearer token is needed unless the `metrics_public` setting is on (point a
Prometheus scrape job at it with `authorization: {credentials: <token>}`, or open it on a network
only the scraper reaches).
"""
from __future__ import annotations

from flask import Blueprint, Response

from common.http.auth import authenticate_request, unauthorized
from common.http.errors import error_response
from pep.http.current import current_services
from pep.metrics import CONTENT_TYPE

# at module level: the route reads the app's services (`current_services`)
bp = Blueprint("xsg_metrics", __name__)


@bp.get("/metrics")
def scrape() -> Response:
    services = current_services()
    if not services.config.metrics_public:
        identity = authenticate_request()
        if identity is None:
            return unauthorized()
        if not identity.admin:
            return error_response(403, "the metrics need an administrator's token (or the "
                                       "metrics_public setting)")
    return Response(services.metrics.exposition(), content_type=CONTENT_TYPE)


def metrics_blueprint() -> Blueprint:
    """GET /metrics (one Blueprint, registered on every gateway app)."""
    return bp


__all__ = ["bp", "metrics_blueprint"]
