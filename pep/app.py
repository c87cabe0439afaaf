"""The gateway's Flask application factory.

`build_services` wires the long-lived parts (store, events, policy service, authenticator) once
per process; `create_app` puts HTTP in front of them. Tests build an app around their own
services; `xsg serve` builds both from a GatewayConfig.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from pdp.api import ManagePolicy, create_pdp_blueprint, may_manage_policy
from pdp.auth import TokenAuthenticator, install_authenticator
from pdp.events import PolicyEvents
from pdp.service import PolicyService, seed_store
from pdp.store import PolicyStore, SQLitePolicyStore, StoredPolicy
from pep.config import GatewayConfig, ensure_data_dir, ensure_demo_auth_file
from pep.explain_api import explain_blueprint
from pep.gateway import register_stream_side
from pep.invalidation import InvalidationHub, invalidation_blueprint
from pep.ownership import stream_owner_rule

log = logging.getLogger(__name__)

SERVICES_EXTENSION = "xsg.services"


@dataclass
class GatewayServices:
    """Everything the HTTP layer needs, created once per process."""

    config: GatewayConfig
    store: PolicyStore
    events: PolicyEvents
    policies: PolicyService
    authenticator: TokenAuthenticator
    may_manage: ManagePolicy = may_manage_policy
    seeded: list[StoredPolicy] = field(default_factory=list)
    demo_auth_created: bool = False
    invalidation: InvalidationHub | None = None
    stream_runtime: Any = None  # a runtime to use instead of Spark's (tests, embedding)
    stream_side: Any = None  # set by create_app: pep.gateway.StreamSide

    def close_stream_side(self) -> None:
        """Close handle readers (final `shutdown` event), stop re-evaluation and the runtime.

        Must run before the HTTP server stops: the server waits for its streaming workers, and
        those finish only when their handle buffers close. Handles stay live for the next start."""
        if self.stream_side is not None:
            self.stream_side.close()

    def close(self) -> None:
        self.close_stream_side()
        if self.invalidation is not None:
            self.invalidation.close()
        self.store.close()


def build_services(config: GatewayConfig) -> GatewayServices:
    """Open (or create) the data directory, auth file and policy store; seed an empty store."""
    ensure_data_dir(config)
    created = ensure_demo_auth_file(config)
    authenticator = TokenAuthenticator.from_file(config.effective_auth_file)
    store = SQLitePolicyStore(config.store_path)
    try:
        seeded = []
        if config.policies_dir is not None:
            seeded = seed_store(store, config.policies_dir, owner=config.seed_owner,
                                root_combining_alg=config.root_combining_alg,
                                root_policy_id=config.root_policy_id)
        events = PolicyEvents()
        policies = PolicyService(store, events, root_combining_alg=config.root_combining_alg,
                                 root_policy_id=config.root_policy_id)
    except BaseException:
        store.close()
        raise
    hub = InvalidationHub(secret=config.proxy_secret, proxy_token=config.proxy_token)
    hub.follow_policy_events(events)
    return GatewayServices(config=config, store=store, events=events, policies=policies,
                           authenticator=authenticator, seeded=seeded, demo_auth_created=created,
                           invalidation=hub)


def _json_errors(app: Flask) -> None:
    """Every error leaves as JSON; client errors keep their 4xx, never an HTML page."""

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        message = exc.description or exc.name
        if exc.code == 413:
            message = (f"request body too large: the limit is "
                       f"{app.config['MAX_CONTENT_LENGTH']} bytes")
        response = jsonify(error=message, status=exc.code)
        response.status_code = exc.code or 500
        if exc.code == 405 and exc.valid_methods:
            response.headers["Allow"] = ", ".join(exc.valid_methods)
        return response

    @app.errorhandler(Exception)
    def internal_error(exc: Exception):
        log.exception("unhandled error")
        response = jsonify(error="internal error; see the gateway log", status=500)
        response.status_code = 500
        return response


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
    _json_errors(app)

    # Looked up per call, so that a later `services.may_manage = ...` (the PEP's rule) applies.
    app.register_blueprint(create_pdp_blueprint(
        services.policies, may_manage=lambda identity, info: services.may_manage(identity, info)))

    # The stream side: /explain, /streams, /requests, /handles, and the invalidation feed that
    # caching proxies follow.
    side = register_stream_side(app, services)
    services.stream_side = side
    if services.may_manage is may_manage_policy:  # keep a rule the embedder chose
        # Through services, so that the rule always asks the stream side currently mounted.
        services.may_manage = stream_owner_rule(
            lambda name: services.stream_side.catalog.get(name))
    app.register_blueprint(explain_blueprint(lambda: services.policies.engine, side.catalog.schema))

    def caller_is_admin() -> bool:
        identity = services.authenticator.authenticate_header(request.headers.get("Authorization"))
        return identity is not None and identity.admin

    app.register_blueprint(invalidation_blueprint(services.invalidation, caller_is_admin))
    return app
