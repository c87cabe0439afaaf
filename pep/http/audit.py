"""`GET /audit`: the audit trail, for administrators (everything) and stream owners (their
streams: the entries about them, and the policy changes confined to them; of an entry about a
join with another owner's stream, only their own side: `pep.audit.views`).

Query parameters, all optional: `kind` (repeatable: granted, refused, handle-revoked, ...),
`stream`, `subject`, `since` and `until` (ISO-8601 UTC, e.g. 2026-11-23T10:00:00Z), `after` (a
`seq`: entries after it), `limit` (1-10,000, default 1,000: the newest that match). Answers
`{"entries": [...], "last_seq": n}`, oldest first.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from flask import Blueprint, jsonify, request

from pdp.http.auth import current_identity, require_identity
from pep.audit.log import AuditLog
from pep.audit.views import owner_view
from pep.core.errors import InvalidInput, NotPermitted

OWNER_ROLES = ("data-owner", "owner")
MAX_LIMIT = 10_000


def _moment(name: str) -> str | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{name} must be an ISO-8601 date-time, got {raw[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _number(name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise InvalidInput(f"{name} must be a whole number from {low} to {high}")
    return int(raw)


def audit_blueprint(log: AuditLog, stream_lookup: Callable[[str], Any]) -> Blueprint:
    bp = Blueprint("xsg_audit", __name__)

    @bp.get("/audit")
    @require_identity()
    def audit():
        identity = current_identity()
        view = None
        if not identity.admin:
            if not any(r in OWNER_ROLES for r in identity.roles):
                raise NotPermitted("the audit trail is for administrators and stream owners")

            def owns(name: Any) -> bool:
                stream = stream_lookup(name) if isinstance(name, str) else None
                return stream is not None and stream.name == name \
                    and stream.owner == identity.subject

            def view(entry: dict) -> dict | None:
                # an owner's streams only; of a join, its own side (pep.audit.views)
                return owner_view(entry, owns)

        entries = log.query(kinds=request.args.getlist("kind") or None,
                            stream=request.args.get("stream"),
                            subject=request.args.get("subject"),
                            since=_moment("since"), until=_moment("until"),
                            after_seq=_number("after", None, 0, 2 ** 62),
                            view=view, limit=_number("limit", 1000, 1, MAX_LIMIT))
        return jsonify(entries=entries, last_seq=entries[-1]["seq"] if entries else None)

    return bp


__all__ = ["audit_blueprint"]
