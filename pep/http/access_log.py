"""One access-log line per request, on the logger `xsg.access` (INFO).

`GET /streams 200 3.1 ms subject=lta remote=127.0.0.1`: method, path, status, duration in
milliseconds, the authenticated subject (when the route authenticated the caller) and the
client's address. With `--log-format json` the same fields are the keys `method`, `path`,
`status`, `duration_ms`, `subject`, `remote` of the line's object.

Never logged: the query string (a handle read token, or anything a client puts there, may be a
credential), headers (Authorization), bodies. A handle's id in the path is replaced by its
`handle_ref` (the first 16 hex digits of its SHA-256, as in the audit trail). A streamed
response (a handle's SSE or NDJSON reader) is logged when it ends, so its duration is the whole
stream's; every other response when it is sent.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Any

from flask import Flask, Response, g, request

from pep.audit.log import handle_ref
from server.streaming import ON_STREAM_END, STREAMED

log = logging.getLogger("xsg.access")

_HANDLE_PATH = re.compile(r"^/handles/([^/]+)")


def _printable(text: str) -> str:
    """No control characters in a log line (a decoded path may hold %0A)."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def loggable_path(path: str) -> str:
    """The request path as logged: handle ids replaced by their references."""
    return _printable(_HANDLE_PATH.sub(lambda m: f"/handles/ref:{handle_ref(m.group(1))}", path))


def record(fields: dict[str, Any], elapsed: float) -> None:
    """Write one line: `fields` holds method, path (as `loggable_path` gives it), status,
    subject and remote; `elapsed` is in seconds."""
    fields["duration_ms"] = round(elapsed * 1000, 1)
    if not log.isEnabledFor(logging.INFO):
        return
    text = f"{fields['method']} {fields['path']} {fields['status']} {fields['duration_ms']} ms"
    if fields.get("subject"):
        text += f" subject={fields['subject']}"
    if fields.get("remote"):
        text += f" remote={fields['remote']}"
    log.info(text, extra={"access": fields})


def install(app: Flask) -> None:
    """Log every request `app` answers (a before/after-request pair)."""

    @app.before_request
    def _access_started() -> None:
        g.xsg_access_started = time.perf_counter()

    @app.after_request
    def _access_finished(response: Response) -> Response:
        started = g.get("xsg_access_started")
        identity = g.get("xsg_identity")
        fields: dict[str, Any] = {
            "method": request.method, "path": loggable_path(request.path),
            "status": response.status_code,
            "subject": _printable(identity.subject) if identity is not None else None,
            "remote": request.remote_addr,
        }

        def write() -> None:
            elapsed = time.perf_counter() - started if started is not None else 0.0
            record(fields, elapsed)

        if request.environ.get(STREAMED):  # the server writes it: logged when it ends
            request.environ.setdefault(ON_STREAM_END, []).append(write)
        elif response.is_streamed:
            response.call_on_close(write)
        else:
            write()
        return response


__all__ = ["install", "loggable_path", "record"]
