"""The gateway's services as the routes find them: on the app serving the request.

`create_app` puts the `GatewayServices` it mounts in `app.extensions` under `SERVICES_EXTENSION`;
a blueprint defined at module level (not built in a closure over the services) reads them here,
inside a request or an app context, so that its routes and helpers can be tested against any app
that carries services.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from flask import current_app

if TYPE_CHECKING:
    from pep.services import GatewayServices

SERVICES_EXTENSION = "xsg.services"


def current_services() -> GatewayServices:
    """The services of the app handling the current request (KeyError: an app without them)."""
    return cast("GatewayServices", current_app.extensions[SERVICES_EXTENSION])


__all__ = ["SERVICES_EXTENSION", "current_services"]
