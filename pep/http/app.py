"""The gateway's Flask application: mounts the blueprints over the services, nothing more.

The services are built (and wired) by `pep.services.build_services`; this factory only puts HTTP
in front of them and installs the one error table (`pep.http.errors`).
"""
from __future__ import annotations

from flask import Flask, request

from pdp.http.api import create_pdp_blueprint
from pdp.http.auth import install_authenticator
from pep.config import GatewayConfig
from pep.http import errors
from pep.http.explain import explain_blueprint
from pep.http.fast_pdp import install_fast_pdp
from pep.http.handles import create_handles_blueprint
from pep.http.invalidation import invalidation_blueprint
from pep.http.requests import create_requests_blueprint
from pep.http.streams import create_streams_blueprint
from pep.services import GatewayServices, build_services

SERVICES_EXTENSION = "xsg.services"


def create_app(config: GatewayConfig | None = None,
               services: GatewayServices | None = None) -> Flask:
    """The gateway app. With no services, they are built from the config (embedded defaults)."""
    if services is None:
        services = build_services(config or GatewayConfig())
    config = services.config
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_content_length
    app.config["JSON_SORT_KEYS"] = False
    app.extensions[SERVICES_EXTENSION] = services
    install_authenticator(app, services.authenticator)
    errors.install(app)

    def engine():
        return services.policies.engine

    base_url = config.base_url.rstrip("/") if config.base_url else None
    # /health, /pdp, /policies; the management rule is read per call (an embedder may swap it)
    app.register_blueprint(create_pdp_blueprint(
        services.policies, may_manage=lambda identity, info: services.may_manage(identity, info)))
    app.register_blueprint(explain_blueprint(engine, services.catalog.schema,
                                             services.decide_and_plan))
    app.register_blueprint(create_streams_blueprint(services.catalog))
    app.register_blueprint(create_requests_blueprint(
        services.handles, engine, services.catalog.schema, services.decide_and_plan, base_url))
    app.register_blueprint(create_handles_blueprint(
        services.handles, base_url, config.heartbeat,
        max_readers_per_subject=config.max_readers_per_subject))

    def caller_is_admin() -> bool:
        identity = services.authenticator.authenticate_header(request.headers.get("Authorization"))
        return identity is not None and identity.admin

    app.register_blueprint(invalidation_blueprint(services.invalidation, caller_is_admin))
    # POST /pdp answered 200 without Flask's machinery; everything else reaches the routes above
    install_fast_pdp(app, services.policies)
    return app


__all__ = ["create_app", "SERVICES_EXTENSION"]
