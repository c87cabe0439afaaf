"""`GET /audit`: the audit trail, for administrators (everything) and stream owners (their
streams: the entries about them, and the policy changes confined to them; of an entry about a
join with another owner's stream, only their own side: `pep.audit.views`).

Query parameters, all optional: `kind` (repeatable: granted, refused, handle-revoked, ...),
`stream`, `subject`, `since` and `until` (ISO-8601 UTC, e.g. 2026-11-23T10:00:00Z), `after` (a
`seq`: entries after it), `limit` (1-10,000, default 1,000: the newest that match). Answers
`{"entries": [...], "last_seq": n}`, oldest first.
"""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, jsonify, request

from common.http.auth import current_identity, require_identity
from common.numbers import parse_int
from pep.audit.views import owner_view
from pep.core.errors import InvalidInput, NotPermitted
from pep.http.current import current_services
from pep.streams.catalog import StreamCatalog

OWNER_ROLES = ("data-owner", "owner")
MAX_LIMIT = 10_000


def _moment(name: str) -> str | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
    except ValueError:
        raise InvalidInput(f"query parameter {name!r} must be an ISO-8601 date-time, got "
                           f"{raw[:40]!r}") from None
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        raise InvalidInput(f"query parameter {name!r}: {raw[:40]!r} is outside years 1 to 9999 "
                           f"in UTC") from None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _number(name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return default
    return parse_int(raw, f"query parameter {name!r}", low=low, high=high)


def _stream_named(catalog: StreamCatalog, name: str) -> Any:
    """The stream of that name, or the deleted one's former entry: a deleted stream's audit
    entries stay its former owner's (its name is reserved to it)."""
    return catalog.get(name) or catalog.deleted(name)


# at module level: the route reads the app's services (`current_services`)
bp = Blueprint("xsg_audit", __name__)


@bp.get("/audit")
@require_identity()
def audit() -> Response:
    """The audit trail, oldest first: all of it for an administrator, a stream owner's own.
    ---
    get:
      parameters:
        - {name: kind, in: query, explode: true, schema: {type: array, items: {type: string}}}
        - {name: stream, in: query, schema: {type: string}}
        - {name: subject, in: query, schema: {type: string}}
        - {name: since, in: query, schema: {type: string, format: date-time}}
        - {name: until, in: query, schema: {type: string, format: date-time}}
        - {name: after, in: query, schema: {type: integer, minimum: 0}}
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000}}
      responses:
        200:
          description: '{"entries": [...], "last_seq": n}'
          content:
            application/json: {}
    """
    services = current_services()
    identity = current_identity()
    view = None
    if not identity.admin:
        if not any(r in OWNER_ROLES for r in identity.roles) and not any(
                e.definition.owner == identity.subject for e in services.catalog.all()):
            # (a consumer that derived a stream owns it: issue 48)
            raise NotPermitted("the audit trail is for administrators and stream owners")

        def owns(name: Any) -> bool:
            stream = _stream_named(services.catalog, name) if isinstance(name, str) else None
            return stream is not None and stream.name == name \
                and stream.owner == identity.subject

        def view(entry: dict[str, Any]) -> dict[str, Any] | None:
            # an owner's streams only; of a join, its own side (pep.audit.views)
            return owner_view(entry, owns)

    entries = services.audit.log.query(kinds=request.args.getlist("kind") or None,
                                       stream=request.args.get("stream"),
                                       subject=request.args.get("subject"),
                                       since=_moment("since"), until=_moment("until"),
                                       after_seq=_number("after", None, 0, 2 ** 62), view=view,
                                       limit=_number("limit", 1000, 1, MAX_LIMIT) or 1000)
    return jsonify(entries=entries, last_seq=entries[-1]["seq"] if entries else None)


def audit_blueprint() -> Blueprint:
    """GET /audit (one Blueprint, registered on every gateway app)."""
    return bp


__all__ = ["bp", "audit_blueprint"]
