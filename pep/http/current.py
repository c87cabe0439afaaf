"""The gateway's services as the routes find them: on the app serving the request.

`create_app` puts the `GatewayServices` it mounts in `app.extensions` under `SERVICES_EXTENSION`;
a blueprint defined at module level (not built in a closure over the services) reads them here,
inside a request or an app context, so that its routes and helpers can be tested against any app
that carries services. The helpers below are what several of those routes ask of the services.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask import current_app, request

from common.http.auth import current_identity
from common.oidc import AuthenticationFailed

if TYPE_CHECKING:
    from pep.core.plan import StreamSchema
    from pep.services import GatewayServices

SERVICES_EXTENSION = "xsg.services"


def current_services() -> GatewayServices:
    """The services of the app handling the current request (KeyError: an app without them)."""
    services: GatewayServices = current_app.extensions[SERVICES_EXTENSION]
    return services


def current_engine() -> Any:
    """The policy engine of the moment (a policy change swaps it)."""
    return current_services().policies.engine


def configured_base_url() -> str | None:
    """The configured public URL of the gateway without its trailing slash (None: unset, the
    handle URLs then use the URL the request reached us by: `pep.http.urls.public_base`)."""
    base_url = current_services().config.base_url
    return base_url.rstrip("/") if base_url else None


def may_see(identity: Any, name: str) -> bool:
    """May this caller see the stream? A stream it may not see (pep/streams/visibility.py) is,
    on every route that names it, a stream that does not exist."""
    visibility = current_services().visibility
    return visibility is None or visibility.may_see(identity, name)


def visible_schema(name: str) -> StreamSchema | None:
    """The schema of a stream the caller may see (POST /requests, /explain; a join's two)."""
    if not may_see(current_identity(), name):
        return None
    return current_services().catalog.schema(name)


def caller_is_admin() -> bool:
    """Is the caller (by its Authorization header) an administrator? AuthenticationFailed for a
    refused token."""
    identity = current_services().authenticator.authenticate_header(
        request.headers.get("Authorization"))
    return identity is not None and identity.admin


def admin_asks() -> bool:
    """For public routes that say more to an administrator: a bad token just says less."""
    try:
        return caller_is_admin()
    except AuthenticationFailed:
        return False


__all__ = ["SERVICES_EXTENSION", "admin_asks", "caller_is_admin", "configured_base_url",
           "current_engine", "current_services", "may_see", "visible_schema"]
