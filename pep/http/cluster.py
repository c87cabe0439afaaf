"""The HTTP side of a cluster (`pep.cluster`): the forwarding route, the answer to `Elsewhere`,
and `GET /cluster` (administrators: the processes, and which serves which stream)."""
from __future__ import annotations

from flask import Flask, Response, jsonify

from common.http.auth import require_identity
from common.http.errors import error_response
from pep.cluster.forward import OWNER_HEADER, ForwardRoute
from pep.cluster.node import ClusterNode
from pep.cluster.placement import Elsewhere
from pep.http.current import caller_is_admin
from server.bridge import NATIVE_ROUTES


def install_cluster(app: Flask, node: ClusterNode) -> None:
    """Requests for streams other processes serve are forwarded there (`ForwardRoute`, tried
    before Flask); a route that meets `Elsewhere` anyway (no forwarding in front: another WSGI
    server, Flask's test client) answers 421 naming the process."""
    routes = list(app.extensions.get(NATIVE_ROUTES, ()))
    routes.append(ForwardRoute(node.member, node.store.member_url, node.moving_within))
    app.extensions[NATIVE_ROUTES] = routes
    app.register_error_handler(Elsewhere, lambda exc: error_response(
        421, f"{exc}; this request must reach that process", {OWNER_HEADER: exc.member}))

    @require_identity()
    def cluster_state() -> Response:
        if not caller_is_admin():
            return error_response(403, "only administrators see the gateway's processes")
        return jsonify(node.describe())

    app.add_url_rule("/cluster", "xsg_cluster", cluster_state, methods=["GET"])


__all__ = ["install_cluster"]
