"""The web console at `/console`: static files shipped beside this module, in its package
(`pep/http/console/`: package data, so that setuptools ships them without a warning about a
directory it would take for a package; issue 42), and two small read-only endpoints it needs
that the rest of the API does not give.

- `GET /console` (and `/console/`, `/console/<file>`): the single-page console. No
  authentication: the files hold no data and no secret. Every answer carries a strict Content
  Security Policy (scripts, styles and connections from this origin only; no inline script, no
  framing), `Referrer-Policy: no-referrer` (the read tokens in EventSource URLs never leave in
  a Referer) and `X-Content-Type-Options: nosniff`.
- `GET /console/whoami` (bearer): `{subject, roles, admin, may_register_streams}`, so the console
  shows each caller the pages and buttons that apply to them. The server decides every call
  anyway; this only spares a user the buttons that would be refused.
- `GET /policies/<id>/handles` (bearer; administrators and those who may manage the policy, as
  for `GET /policies/<id>`): how many live handles depend on the policy, i.e. would be re-decided
  and revoked by deleting it: `{"policy": id, "live_handles": n, "streams": {stream: n},
  "subjects": [...]}`. Never handle ids: they are their holders' capabilities. A join's handle
  is counted on the streams of its two that the policy can apply to, and an owner is shown only
  its own streams: not which other owner's stream its consumers join it with. A policy id that
  itself ends in `/handles` is still readable: when the full path names a policy, the answer is
  that policy, as `GET /policies/<id>` gives it.

The console calls nothing else than the public API, with the bearer token the user signs in
with, which it keeps in page memory only (never in localStorage, sessionStorage or a cookie);
EventSource connections carry handle read tokens (`pep.http.read_tokens`).
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, send_from_directory

from common.http.auth import current_identity, require_identity
from common.http.errors import error_response
from pdp import ManagedPolicy, PolicyNotFoundError
from pdp.http import STORED_NOT_YOURS
from pep.http.current import current_services
from pep.http.streams import may_register
from pep.streams.ownership import owner_or_admin

STATIC_DIR = Path(__file__).resolve().parent  # never this module: STATIC_NAME has no .py
STATIC_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\.(?:js|css|svg|png|txt)$")
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")


def _hardened(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Cache-Control"] = "no-cache"
    return response


# Defined once, at module level: the routes read the app's services (`pep.http.current`), so
# any gateway app serves them.
bp = Blueprint("xsg_console", __name__)


@bp.get("/console")
@bp.get("/console/")
def console_index() -> Response:
    return _hardened(send_from_directory(STATIC_DIR, "index.html", max_age=0))


@bp.get("/console/<name>")
def console_file(name: str) -> Response:
    if not STATIC_NAME.match(name) or not (STATIC_DIR / name).is_file():
        return error_response(404, f"no console file {name[:60]!r}")
    return _hardened(send_from_directory(STATIC_DIR, name, max_age=0))


@bp.get("/console/whoami")
@require_identity()
def whoami() -> Response:
    identity = current_identity()
    response = jsonify(subject=identity.subject, roles=list(identity.roles),
                       admin=bool(identity.admin),
                       may_register_streams=bool(may_register(identity)))
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/policies/<path:policy_id>/handles")
@require_identity()
def policy_handles(policy_id: str) -> Any:  # a Response, or GET /policies/<id>'s answer
    """The live handles a policy grants, counted on the streams the caller manages."""
    services = current_services()
    policies = services.policies
    full_id = f"{policy_id}/handles"
    if policies.policy_info(policy_id) is None and policies.policy_info(full_id) is not None:
        # the path names a policy whose id ends in /handles: answer as GET /policies/<id>
        return current_app.view_functions["pdp.get_policy"](policy_id=full_id)
    info = policies.policy_info(policy_id)
    if info is None:
        return error_response(404, f"policy {policy_id!r} not found")
    try:
        stored = policies.get(policy_id)
    except PolicyNotFoundError:
        return error_response(404, f"policy {policy_id!r} not found")
    identity = current_identity()
    verdict = services.may_manage(identity, ManagedPolicy.of(info, stored.data))
    if not verdict:
        reason = getattr(verdict, "reason", None)
        if reason and not owner_or_admin(identity, stored.owner):
            reason = STORED_NOT_YOURS  # the reason would quote another's document
        message = f"{identity.subject!r} may not read policy {policy_id!r}"
        return error_response(403, f"{message}: {reason}" if reason else message)
    live = [r for r in services.handles.live() if policy_id in r.policy_ids]
    scope = policies.engine.resource_scope(policy_id)

    def counted(name: str) -> bool:
        if scope is not None and name not in scope:
            return False
        stream = services.catalog.get(name)
        return owner_or_admin(identity, stream.owner if stream is not None else None)

    streams = Counter(s for r in live for s in r.streams if counted(s))
    response = jsonify(policy=policy_id, live_handles=len(live),
                       streams=dict(sorted(streams.items())),
                       subjects=sorted({r.subject for r in live}))
    response.headers["Cache-Control"] = "no-store"
    return response


def console_blueprint() -> Blueprint:
    """The console's files and its two read-only endpoints (one Blueprint, registered on every
    gateway app)."""
    return bp


__all__ = ["bp", "console_blueprint", "STATIC_DIR", "CONTENT_SECURITY_POLICY"]
