"""A small real gateway stand-in for the proxy tests: the gateway's HTTP contract, the real hub.

It authenticates bearer tokens, answers `POST /requests` with a handle (the same one for a repeated
identical request, as the gateway does), streams `GET /handles/<id>` as SSE, releases on DELETE,
and revokes through an admin call; releases and revocations publish on a real InvalidationHub
before the call returns. The feed can be switched off to simulate a gateway the proxy cannot reach.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time

from flask import Flask, Response, jsonify, request

from pep.http.invalidation import bp as invalidation_bp, install_invalidation
from pep.invalidation.hub import InvalidationHub

TOKENS = {"tok-alice": "alice", "tok-alice-2": "alice", "tok-bob": "bob", "tok-admin": "admin"}
PROXY_TOKEN = "proxy-feed-token"
SECRET = "webhook-shared-secret"


class FakeGateway:
    def __init__(self, heartbeat: float = 0.2) -> None:
        self.hub = InvalidationHub(secret=SECRET, proxy_token=PROXY_TOKEN, heartbeat=heartbeat,
                                   timeout=1.0, connect_timeout=0.5)
        self.lock = threading.Lock()
        self.request_calls = 0
        self.handles: dict[str, dict] = {}  # id -> {subject, state, key}
        self.by_key: dict[tuple, str] = {}
        self.feed_blocked = False
        self.stream_gate = threading.Event()  # the SSE stream pauses after its first event
        self.base_url: str | None = None  # as the gateway's configured public URL
        self.targets: list[str] = []  # each request's target as it arrived (RAW_URI)
        self.app = self._build()

    def _subject(self) -> str | None:
        header = request.headers.get("Authorization", "")
        return TOKENS.get(header[7:]) if header.startswith("Bearer ") else None

    def revoke(self, ident: str, kind: str = "handle-revoked") -> None:
        with self.lock:
            entry = self.handles[ident]
            entry["state"] = "revoked" if kind == "handle-revoked" else "released"
            self.by_key.pop(entry["key"], None)
        self.hub.publish(kind, [ident], subject=entry["subject"])

    def _build(self) -> Flask:
        app = Flask("fake-gateway")

        @app.before_request
        def record_target():
            with self.lock:
                self.targets.append(request.environ.get("RAW_URI", ""))
        install_invalidation(app, self.hub, require_admin=lambda: self._subject() == "admin")

        def blocked():
            if self.feed_blocked:
                return jsonify(error="feed switched off by the test"), 503
            return None

        # after the feed's own check, on this app's feed routes only
        app.before_request_funcs.setdefault(invalidation_bp.name, []).append(blocked)

        @app.get("/health")
        def health():
            return jsonify(status="ok")

        @app.post("/requests")
        def stream_request():
            subject = self._subject()
            if subject is None:
                return jsonify(error="missing bearer token"), 401
            body = request.get_data()
            with self.lock:
                self.request_calls += 1
            if b"deny-me" in body:
                return jsonify(decision="Deny"), 403
            if not body.strip():
                return jsonify(error="empty request"), 400
            # The real gateway keys on the parsed request; the body digest is enough here.
            key = (subject, hashlib.sha256(body).hexdigest(),
                   request.headers.get("Content-Type", ""))
            with self.lock:
                ident = self.by_key.get(key)
                status = 200
                if ident is None:
                    ident = secrets.token_urlsafe(12)
                    self.by_key[key] = ident
                    self.handles[ident] = {"subject": subject, "state": "live", "key": key}
                    status = 201
            url = (self.base_url or request.host_url) + "handles/" + ident
            if b"conflict-me" in body:  # the one-window rule, naming the handle to release
                return jsonify(error="one window per stream", handle=url,
                               release=f"DELETE {url}"), 409
            return (jsonify(handle=url, id=ident, new=status == 201, warnings=[],
                            plan={"stream": "weather"}), status, {"Location": url})

        @app.route("/handles/<ident>", methods=["GET", "DELETE"])
        def handle(ident: str):
            subject = self._subject()
            with self.lock:
                entry = self.handles.get(ident)
            if entry is None or subject != entry["subject"]:
                return jsonify(error="no such handle"), 404
            if entry["state"] != "live":
                return jsonify(error=f"handle {entry['state']}"), 410
            if request.method == "DELETE":
                self.revoke(ident, "handle-released")
                return "", 204

            def events():
                yield f"id: 1\nevent: tuple\ndata: {json.dumps({'n': 1})}\n\n"
                self.stream_gate.wait(5)
                for n in range(2, 5):
                    time.sleep(0.01)
                    yield f"id: {n}\nevent: tuple\ndata: {json.dumps({'n': n})}\n\n"
                yield "event: end\ndata: {}\n\n"

            return Response(events(), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache"})

        @app.post("/admin/revoke/<ident>")
        def admin_revoke(ident: str):
            if self._subject() != "admin":
                return jsonify(error="admin only"), 403
            self.revoke(ident)
            return jsonify(revoked=ident)

        @app.post("/streams/<name>/records")
        def records(name: str):
            if self._subject() is None:
                return jsonify(error="missing bearer token"), 401
            body = request.get_data()
            return jsonify(stream=name, bytes=len(body),
                           sha256=hashlib.sha256(body).hexdigest(),
                           chunked="chunked" in request.headers.get("Transfer-Encoding", ""))

        @app.delete("/policies/<pid>")
        def delete_policy(pid: str):
            self.hub.publish("policy-changed", policy_id=pid)
            return "", 204

        return app
