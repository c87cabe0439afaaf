"""The gateway's Flask application: mounts the blueprints over the services, nothing more.

The services are built (and wired) by `pep.services.build_services`; this factory only puts HTTP
in front of them and installs the one error table (`pep.http.errors`).
"""
from __future__ import annotations

from flask import Flask

from common.http.auth import current_identity, install_authenticator
from common.http.errors import error_response
from common.http.safe_json import install_safe_json
from common.oidc import AuthenticationFailed
from pdp.http import create_pdp_blueprint
from pep.config import GatewayConfig
from pep.http import access_log, errors
from pep.http.audit import audit_blueprint
from pep.http.console import console_blueprint
from pep.http.cors import install_cors
from pep.http.current import (
    SERVICES_EXTENSION,
    admin_asks,
    caller_is_admin,
    current_engine,
    visible_schema,
)
from pep.http.derived import derived_blueprint
from pep.http.events import events_blueprint
from pep.http.explain import install_explain
from pep.http.fast_pdp import install_fast_pdp
from pep.http.handles import create_handles_blueprint
from pep.http.health import stream_health
from pep.http.invalidation import install_invalidation
from pep.http.metrics import metrics_blueprint
from pep.http.openapi import create_openapi_blueprint
from pep.http.read_tokens import ReadTokens, install_read_tokens
from pep.http.requests import RequestRoutes, install_requests
from pep.http.rules import Rules, install_rules
from pep.http.streams import install_streams
from pep.services import GatewayServices, build_services
from pep.streams.policy_check import check_policy
from pep.streams.policy_lint import lint_write


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
    install_safe_json(app)  # request.get_json() within the size and depth limits: a 400, not a 500
    install_authenticator(app, services.authenticator)
    errors.install(app)
    # a refused JWT: 401 (503 when the issuer's keys are out of reach) saying why
    app.register_error_handler(AuthenticationFailed, lambda exc: error_response(
        exc.status, exc.message, exc.headers))
    access_log.install(app)

    # /health, /pdp, /policies; the management rule is read per call (an embedder may swap it);
    # sharing rules are a second way to write a policy, every policy has a one-line summary,
    # every write is checked against the stream schemas and linted against the policy set
    # (its findings are the answer's warnings), and a write with ?dry_run=true says what it
    # would do to the live handles
    rules = Rules(services)
    app.register_blueprint(create_pdp_blueprint(
        services.policies, may_manage=lambda identity, info: services.may_manage(identity, info),
        check_policy=lambda document, source: check_policy(
            document, services.catalog.get, services.catalog.definitions, source,
            derivation=services.derived.derivation if services.derived else None) + lint_write(
            document, source, services.policies.engine, services.catalog,
            config.obligation_combining, current_identity(), services.may_manage),
        environment=services.stream_events.environment_for,
        health_details=lambda: stream_health(services.runtime, admin_asks()),
        formats=[rules.policy_format()], what_if=rules.what_if, describe=rules.describe,
        base_url=config.base_url))
    install_rules(app, rules)
    # A stream the caller may not see (pep/streams/visibility.py) is, on every route that names
    # it, a stream that does not exist: `visible_schema` and `may_see` find nothing for it.
    privacy = services.privacy
    install_explain(app, current_engine, visible_schema, services.access.decide_and_plan,
                    privacy_status=privacy.status if privacy is not None else None)
    install_streams(app, services.catalog, visibility=services.visibility,
                    lifecycle=services.lifecycle)

    # POST /requests, with what it works with (every refusal is audited and counted)
    install_requests(app, RequestRoutes(
        engine=lambda: services.policies.engine, access=services.access,
        handles=services.handles, parsed=services.revocation.parsed, catalog=services.catalog,
        visibility=services.visibility, authenticator=services.authenticator,
        audit=services.audit, metrics=services.metrics,
        base_url=config.base_url.rstrip("/") if config.base_url else None))
    app.register_blueprint(metrics_blueprint())  # reads the services from app.extensions
    # GET /audit: a deleted stream's entries stay its former owner's (its name is reserved to it)
    app.register_blueprint(audit_blueprint())  # reads the services from app.extensions
    app.register_blueprint(events_blueprint())  # reads the services from app.extensions
    app.register_blueprint(create_handles_blueprint(config.max_readers_per_subject))
    # POST /handles/<id>/derive, GET /streams/<name>/derivation: re-sharing (grant option)
    app.register_blueprint(derived_blueprint())  # reads the services from app.extensions

    install_invalidation(app, services.invalidation, caller_is_admin)
    # the web console, the handle read tokens its EventSources carry, CORS for other web apps
    install_read_tokens(app, ReadTokens(services.read_token_key, config.read_token_ttl,
                                        lambda: services.authenticator.identities))
    app.register_blueprint(console_blueprint())  # reads the services from app.extensions
    install_cors(app, config.cors_origins)
    # GET / (the XACML REST home document) and GET /openapi.json, generated from these routes
    app.register_blueprint(create_openapi_blueprint())
    # POST /pdp answered without Flask's machinery, with the route's own code; everything else
    # reaches the routes above
    install_fast_pdp(app, services.policies, services.stream_events.environment_for)
    if services.cluster is not None:  # requests for streams other processes serve go there
        from pep.http.cluster import install_cluster

        install_cluster(app, services.cluster)
    return app


__all__ = ["create_app", "SERVICES_EXTENSION"]
