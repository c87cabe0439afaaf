"""The caching proxy as a Flask app: forwards the gateway's API and caches stream-request answers.

Routes of its own live under `/proxy/` (`stats`, `metrics`, `health`, `invalidate`); every other
path goes to the gateway. Only `POST /requests` answers are cached, and only successful handle
answers (200/201 JSON with a `handle`), keyed as `proxy.canonical` explains. A hit is answered `200`
with the cached body (the gateway, too, answers a repeated identical request with the same handle)
and `X-XSG-Cache: hit`; other answers carry `miss` or `bypass`.

Handle URLs in answers point at the gateway; when they start with the upstream's base URL they are
rewritten to the proxy's own base (or `public_base`), so consumers read handles through the proxy.
The rewriting happens when answering, so a cached answer fits every host name the proxy is reached
by.

The routes are module-level functions of `blueprint` (Flask's application-factory pattern): each
finds the proxy's `ProxyRuntime` in `current_app.extensions`, so an app is only its runtime and
the pieces can be called (and tested) on their own inside a request context.

Besides the gateway's events, the proxy drops entries on what it sees pass by: a `DELETE
/handles/<id>` (before and after forwarding), a `404`/`410` on a handle, a policy added by `POST
/policies` (the entries on the streams its target is confined to, else a flush) and any other
successful write under `/policies` (flush). These are shortcuts, never the only channel.
"""
from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from io import BytesIO
from typing import IO, Any
from urllib.parse import quote, urlsplit

import httpx
from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.wrappers import Request as WerkzeugRequest

from common.http.errors import REFUSAL_STATUS, error_response, install_error_handlers
from common.http.safe_json import install_safe_json
from common.invalidation import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    InvalidationEvent,
    InvalidEventError,
    verify,
)
from common.xmlsafe import parse_json
from pdp import confined_resource_ids
from proxy.cache import CachedAnswer, HandleCache
from proxy.canonical import (
    Canon,
    CanonicalRequest,
    NotCacheable,
    cache_key,
    canonical_query,
    canonical_request,
    resource_ids,
    subject_key,
)
from proxy.edges import EdgeChooser
from proxy.feed import FeedClient
from proxy.forward import (
    CACHE_HEADER,
    Forwarder,
    NotForwardable,
    Timeouts,
    UpstreamBody,
    UpstreamError,
    is_chunked,
    make_client,
    request_headers,
    response_headers,
)
from proxy.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, metrics_text
from proxy.relay import HandleRelay
from proxy.sync import CacheSync
from server.bridge import NATIVE_ROUTES

log = logging.getLogger(__name__)

EXTENSION = "xsg.proxy"
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
MAX_ANSWER_BYTES = 256 * 1024
SEVERAL_UPSTREAMS = "several-upstreams"  # the cache's state in front of several processes
JsonObject = dict[str, Any]  # a decoded JSON object (a gateway's answer), its members unchecked


@dataclass
class ProxyConfig:
    upstream: str  # the gateway's base URL; several, comma-separated: one gateway's processes
    feed_token: str | None = None  # bearer token for the gateway's invalidation feed
    webhook_secret: str | None = None  # HMAC key shared with the gateway's hub
    webhook_url: str | None = None  # where the gateway can reach POST /proxy/invalidate
    max_entries: int = 10_000
    ttl: float = 300.0
    require_feed: bool = True  # False: cache without a feed (webhooks only; tests, one host)
    start_feed: bool = True
    feed_read_timeout: float = 6.0
    feed_backoff: tuple[float, float] = (0.2, 5.0)
    signature_window: float = 300.0
    webhook_grace: float = 3.0  # an event seen on the feed must arrive by webhook within this
    public_base: str | None = None
    rewrite_handles: bool = True
    max_request_bytes: int = 1024 * 1024
    timeouts: Timeouts | None = None
    pool_size: int = 32
    upstream_ca: str | None = None  # CA file for a gateway on HTTPS (None: the system's CAs)
    edges: tuple[str, ...] = ()  # the gateway's edges: its 307s to one are followed (edges.py)


class ProxyRuntime:
    """Everything one proxy app holds; `close()` stops the feed thread and open streams."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        upstreams = [u.strip() for u in config.upstream.split(",") if u.strip()]
        self.upstream = upstreams[0].rstrip("/") + "/"
        self.upstream_prefix = urlsplit(self.upstream).path  # ends with "/"
        self.cache = HandleCache(config.max_entries, config.ttl)
        self.sync = CacheSync(
            self.cache, require_feed=config.require_feed,
            expect_webhooks=bool(config.require_feed and config.webhook_secret
                                 and config.webhook_url),
            webhook_grace=config.webhook_grace)
        self.verify: bool | str = config.upstream_ca or True
        self.forwarder = Forwarder(upstreams, make_client(config.pool_size, self.verify),
                                   timeouts=config.timeouts or Timeouts())
        self.salt = secrets.token_bytes(32)
        self.edges = EdgeChooser(config.edges) if config.edges else None
        self.feed: FeedClient | None = None
        if len(upstreams) > 1:
            # several processes of one gateway: each announces the ends of the handles it
            # serves on its own feed, and following one feed would miss the others' (a cached
            # answer could outlive its handle); so no cache: forwarded, spread, failed over
            self.sync.state = SEVERAL_UPSTREAMS
            self.sync.cache.set_enabled(False)
            log.warning("%d upstreams (one gateway's processes): forwarding, without caching",
                        len(upstreams))
        elif config.require_feed:
            self.feed = FeedClient(self.upstream, self.sync, config.feed_token,
                                   config.webhook_url, read_timeout=config.feed_read_timeout,
                                   backoff=config.feed_backoff, verify=self.verify)
        self._lock = threading.Lock()
        self.counters = {"stream_requests": 0, "forwarded": 0, "bypassed": 0,
                         "upstream_errors": 0, "local_invalidations": 0}
        self.last_bypass: str | None = None

    def count(self, name: str, reason: str | None = None) -> None:
        with self._lock:
            self.counters[name] += 1
            if reason is not None:
                self.last_bypass = reason

    def start(self) -> None:
        if self.feed is not None:
            self.feed.start()

    def close(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        self.forwarder.close()

    def stats(self) -> dict[str, Any]:
        feed = self.sync.stats()
        if self.feed is not None:
            feed.update(self.feed.stats())
        with self._lock:
            counters = dict(self.counters, last_bypass_reason=self.last_bypass)
        mode = "caching" if self.cache.enabled else "pass-through"
        return {"mode": mode, "upstream": self.upstream, "cache": self.cache.stats(),
                "feed": feed, "requests": counters,
                "upstream_calls": self.forwarder.sent,
                "upstream_failures": self.forwarder.failures}


def handle_id_of(url: str) -> str | None:
    path = urlsplit(url).path
    marker = path.rfind("/handles/")
    if marker < 0:
        return None
    ident = path[marker + len("/handles/"):]
    return ident if ident and "/" not in ident else None


def answer_streams(doc: JsonObject, requested: frozenset[str]) -> frozenset[str] | None:
    """The streams whose policies decide a handle answer: the handle's streams as the gateway
    names them (`streams`, or `stream`) and the resource-ids the request named; None when the
    answer names none (then any policy change drops it: deny when in doubt)."""
    named = doc.get("streams")
    if not isinstance(named, list) or not named:
        named = [doc.get("stream")]
    if not all(isinstance(s, str) and s for s in named):
        return None
    return frozenset(named) | requested


def create_app(config: ProxyConfig) -> Flask:
    """The proxy's app: its runtime in `app.extensions` (read by the routes of `blueprint`
    through `current_app`), the native relay of handle streams, the one error body."""
    app = Flask(__name__)
    runtime = ProxyRuntime(config)
    app.extensions[EXTENSION] = runtime
    # on the proxy's own server, handle streams are relayed on its event loop (proxy/relay.py);
    # the Flask route below relays them elsewhere
    app.extensions[NATIVE_ROUTES] = [HandleRelay(runtime)]
    if config.start_feed:
        runtime.start()

    # The gateway's one error body, also for what Flask refuses before a route (and a logged
    # 500 that says no more than that for anything unexpected)
    install_error_handlers(app, REFUSAL_STATUS)
    install_safe_json(app)
    app.register_blueprint(blueprint)
    return app


blueprint = Blueprint("proxy", __name__)


def current_runtime() -> ProxyRuntime:
    """The runtime of the app serving the current request."""
    runtime: ProxyRuntime = current_app.extensions[EXTENSION]
    return runtime


# -- the proxy's own routes -------------------------------------------------------------------


@blueprint.get("/proxy/stats")
def stats() -> Response:
    return jsonify(current_runtime().stats())


@blueprint.get("/proxy/metrics")
def metrics() -> Response:
    return Response(metrics_text(current_runtime().stats), content_type=METRICS_CONTENT_TYPE)


@blueprint.get("/proxy/health")
def health() -> Response:
    runtime = current_runtime()
    return jsonify(status="ok", mode="caching" if runtime.cache.enabled else "pass-through",
                   feed=runtime.sync.state)


@blueprint.post("/proxy/invalidate")
def invalidate() -> Response:
    """A signed webhook from the gateway's hub: one invalidation event."""
    runtime = current_runtime()
    config = runtime.config
    if not config.webhook_secret:
        return error_response(503, "this proxy has no webhook secret configured")
    body, complete = _read_up_to(request.stream, 1024 * 1024)
    if not complete:
        return error_response(413, "invalidation body over 1 MiB")
    reason = verify(config.webhook_secret, body, request.headers.get(SIGNATURE_HEADER),
                    request.headers.get(TIMESTAMP_HEADER), config.signature_window)
    if reason is not None:
        runtime.sync.note_webhook(accepted=False)
        log.warning("invalidation webhook refused: %s", reason)
        return error_response(401, f"invalidation refused: {reason}")
    try:
        # within the size and depth limits: json.loads recurses (a RecursionError, a 500)
        event = InvalidationEvent.from_json(parse_json(body))
    except (ValueError, InvalidEventError) as exc:  # UnsafeDocumentError is a ValueError
        return error_response(400, f"malformed invalidation event: {exc}")
    outcome = runtime.sync.apply(event, "webhook")
    runtime.sync.note_webhook(accepted=True)
    return jsonify(result=outcome, position=runtime.sync.position)


@blueprint.app_errorhandler(413)
def too_large(_exc: Exception) -> Response:
    return error_response(413, "request body too large")


# -- forwarding -------------------------------------------------------------------------------


@blueprint.route("/", defaults={"path": ""}, methods=ALL_METHODS,
                 provide_automatic_options=False)
@blueprint.route("/<path:path>", methods=ALL_METHODS, provide_automatic_options=False)
def proxied(path: str) -> Response:
    """Everything else: stream requests (cached), handle calls, and the rest forwarded."""
    runtime = current_runtime()
    route = "/" + path
    try:
        if route == "/requests" and request.method == "POST":
            return stream_request(runtime)
        ident = handle_id_of(route) if route.startswith("/handles/") else None
        if ident is not None and route == "/handles/" + ident:
            return handle_call(runtime, ident)
        out = forward(runtime)
        if (route == "/policies" or route.startswith("/policies/")) and \
                request.method not in ("GET", "HEAD") and 200 <= out.status_code < 300:
            scope = added_policy_scope(runtime, route) if request.method == "POST" else None
            if scope is None:
                runtime.cache.flush()
            else:
                runtime.cache.invalidate_streams(scope)
            runtime.count("local_invalidations")
        return out
    except NotForwardable as exc:
        return error_response(exc.status, str(exc))
    except UpstreamError as exc:
        runtime.count("upstream_errors")
        return error_response(exc.status, str(exc))


def public_base(runtime: ProxyRuntime) -> str:
    return (runtime.config.public_base or request.host_url).rstrip("/") + "/"


def rewrite(runtime: ProxyRuntime, url: str | None) -> str | None:
    """A handle URL of the gateway -> the same handle through this proxy.

    Matched on the path, not the host: the gateway may name itself by another host name
    (its configured base URL) than the one the proxy uses to reach it.
    """
    if not url or not runtime.config.rewrite_handles:
        return url
    parts = urlsplit(url)
    prefix = runtime.upstream_prefix
    if parts.scheme not in ("http", "https") or not parts.path.startswith(prefix):
        return url
    rest = parts.path[len(prefix):]
    if not rest.startswith("handles/"):
        return url
    return public_base(runtime) + rest + (f"?{parts.query}" if parts.query else "")


def upstream_path() -> str:
    """The path as the client sent it (the server checked it is visible ASCII): decoding it
    here and quoting it again would decode it twice upstream (`/%2562ars` became `/bars`)."""
    raw: str | None = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI")
    if raw and raw.startswith("/"):
        return raw.split("?", 1)[0]
    return quote(request.path, safe="/:@!$&'()*+,;=-._~")


def outgoing_headers(**overrides: str) -> dict[str, str]:
    headers = request_headers(request.headers, request.remote_addr, request.scheme,
                              request.host)
    headers.update(overrides)
    return headers


def chunked_upload() -> bool:
    return "chunked" in request.headers.get("Transfer-Encoding", "").lower()


def outgoing_body(runtime: ProxyRuntime, prefix: bytes = b"") -> UpstreamBody:
    """The request's body as it goes upstream: bytes, a sized stream, or chunks as they come."""
    length = request.content_length
    if length is not None and not prefix:
        if length == 0:
            return None
        if length <= runtime.forwarder.buffer_limit:
            return request.get_data(cache=True)
        return runtime.forwarder.sized_body(request.stream, length)
    if prefix or chunked_upload():
        # No length known: relay as it comes (requests sends it chunked).
        def relay() -> Iterator[bytes]:
            if prefix:
                yield prefix
            while chunk := request.stream.read(64 * 1024):
                yield chunk
        return relay()
    return None


def passthrough(runtime: ProxyRuntime, resp: httpx.Response, cache_state: str,
                prefix: bytes = b"") -> Response:
    keep_length = not is_chunked(resp) and not prefix
    headers = response_headers(resp, keep_length)

    def body() -> Iterator[bytes]:
        if prefix:
            yield prefix
        yield from runtime.forwarder.stream_body(resp)

    out = Response(body(), status=resp.status_code, headers=headers, direct_passthrough=True)
    out.headers[CACHE_HEADER] = cache_state
    if "Location" in out.headers:
        out.headers["Location"] = rewrite(runtime, out.headers["Location"]) or ""
    return out


def forward(runtime: ProxyRuntime, streaming: bool = False, cache_state: str = "bypass",
            prefix: bytes = b"") -> Response:
    resp = runtime.forwarder.send(request.method, upstream_path(), request.query_string,
                                  outgoing_headers(), outgoing_body(runtime, prefix),
                                  streaming=streaming)
    runtime.count("forwarded")
    return passthrough(runtime, resp, cache_state)


def rewrite_doc(runtime: ProxyRuntime, doc: JsonObject, hit: bool) -> bool:
    """Point handle URLs at the proxy; a hit is a repeat, so `new` is false. Changed?"""
    before = dict(doc)
    if isinstance(doc.get("handle"), str):
        doc["handle"] = rewrite(runtime, doc["handle"])
    release = doc.get("release")
    if isinstance(release, str) and release.startswith("DELETE "):
        doc["release"] = "DELETE " + (rewrite(runtime, release[7:]) or release[7:])
    if hit and doc.get("new") is True:
        doc["new"] = False
    return doc != before


def render(runtime: ProxyRuntime, answer: CachedAnswer, status: int,
           cache_state: str) -> Response:
    body = answer.body
    doc = json.loads(body)
    if rewrite_doc(runtime, doc, hit=cache_state == "hit"):
        body = json.dumps(doc).encode("utf-8")
    out = Response(body, status=status, content_type=answer.content_type)
    for name, value in answer.headers:
        out.headers[name] = value
    if answer.location:
        out.headers["Location"] = rewrite(runtime, answer.location) or answer.location
    out.headers[CACHE_HEADER] = cache_state
    return out


def key_for(runtime: ProxyRuntime, body: bytes) -> tuple[str, frozenset[str]]:
    """The cache key, and the streams the request names (its resource-ids)."""
    subject = subject_key(request.headers.get("Authorization"), runtime.salt)
    ctype = request.headers.get("Content-Type", "")
    if ctype.split(";", 1)[0].strip().lower() == "multipart/form-data":
        canon_req, canon_query = _multipart(body, ctype)
    else:
        canon_req, canon_query = canonical_request(body, ctype), None
    args = [(k, v) for k, v in request.args.items(multi=True)]
    # the raw path, not "/requests": the proxy routes on the path decoded once and so does the
    # gateway, but what decodes it behind the proxy is not the proxy's to assume
    return (cache_key(subject, upstream_path(), args, canon_req, canon_query),
            resource_ids(canon_req))


def answer_of(resp: httpx.Response, body: bytes, requested: frozenset[str] = frozenset()
              ) -> CachedAnswer | None:
    """The upstream's answer as a cache entry, when it is a handle answer (200/201 JSON)."""
    if resp.status_code not in (200, 201):
        return None
    ctype = resp.headers.get("Content-Type", "")
    if "json" not in ctype or resp.headers.get("Content-Encoding", "identity") != "identity":
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    handle = doc.get("handle") if isinstance(doc, dict) else None
    ident = handle_id_of(handle) if isinstance(handle, str) else None
    if ident is None:
        return None
    return CachedAnswer(ident, resp.status_code, body, ctype, resp.headers.get("Location"),
                        streams=answer_streams(doc, requested))


def stream_request(runtime: ProxyRuntime) -> Response:
    """`POST /requests`: from the cache, or forwarded and (a handle answer) stored."""
    config = runtime.config
    runtime.count("stream_requests")
    # Snapshot first: an invalidation from here on keeps this answer out of the cache.
    generation = runtime.cache.generation()
    length = request.content_length
    if length is not None and length > config.max_request_bytes:
        runtime.count("bypassed", "request body over the canonicalisation limit")
        return forward(runtime)
    if length is None and not chunked_upload():
        body = b""
    else:
        body, complete = _read_up_to(request.stream, config.max_request_bytes)
        if not complete:
            runtime.count("bypassed", "request body over the canonicalisation limit")
            return forward(runtime, prefix=body)
    key = None
    requested: frozenset[str] = frozenset()
    if not runtime.cache.enabled:
        runtime.count("bypassed", f"cache off: invalidation feed {runtime.sync.state}")
    else:
        try:
            key, requested = key_for(runtime, body)
        except NotCacheable as exc:
            runtime.count("bypassed", f"not cacheable: {exc}"[:200])
        except Exception as exc:  # a canonicaliser bug must not become a 500
            log.exception("canonicalisation failed")
            runtime.count("bypassed", f"canonicalisation error: {type(exc).__name__}")
    if key is not None:
        cached = runtime.cache.get(key)
        if cached is not None:
            return render(runtime, cached, 200, "hit")
    resp = runtime.forwarder.send("POST", upstream_path(), request.query_string,
                                  outgoing_headers(**{"Accept-Encoding": "identity"}), body)
    runtime.count("forwarded")
    try:
        data, complete = runtime.forwarder.read_limited(resp, MAX_ANSWER_BYTES)
    except Exception as exc:  # noqa: BLE001 - connection cut mid-answer
        resp.close()
        raise UpstreamError(f"gateway broke off its answer: {type(exc).__name__}", 502) \
            from None
    state = "miss" if key is not None else "bypass"
    if not complete:
        return passthrough(runtime, resp, state, prefix=data)
    resp.close()
    answer = answer_of(resp, data, requested)
    if answer is None:
        if "json" in resp.headers.get("Content-Type", ""):  # e.g. a 409 naming a handle
            try:
                doc = json.loads(data)
                if isinstance(doc, dict) and rewrite_doc(runtime, doc, hit=False):
                    data = json.dumps(doc).encode("utf-8")
            except ValueError:
                pass
        out = Response(data, status=resp.status_code,
                       headers=response_headers(resp, keep_length=False))
        out.headers[CACHE_HEADER] = state
        return out
    if key is not None:
        runtime.cache.put(key, answer, generation)
    return render(runtime, answer, answer.status, state)


def added_policy_scope(runtime: ProxyRuntime, route: str) -> frozenset[str] | None:
    """(after forwarding) The streams a policy added by `POST /policies` can concern, when
    its target proves it (pdp.policy_scope) and its body was buffered; None otherwise."""
    length = request.content_length
    if route != "/policies" or not length or length > runtime.forwarder.buffer_limit:
        return None
    return confined_resource_ids(request.get_data(cache=True))


def handle_call(runtime: ProxyRuntime, ident: str) -> Response:
    """A call on a handle: forwarded (a GET streamed); a release or a dead handle drops it."""
    if request.method == "DELETE":
        runtime.cache.invalidate_handles([ident])
        runtime.count("local_invalidations")
    out = forward(runtime, streaming=request.method == "GET")
    if request.method == "DELETE" or out.status_code in (404, 410):
        runtime.cache.invalidate_handles([ident])
    return out


def _multipart(body: bytes, content_type: str) -> tuple[CanonicalRequest, Canon | None]:
    """Canonical (request, query) from multipart parts `request` and `query` (nothing else)."""
    environ_request = WerkzeugRequest.from_values(
        input_stream=BytesIO(body), content_length=len(body), content_type=content_type,
        method="POST")
    environ_request.max_form_parts = 8
    parts: dict[str, tuple[bytes, str | None]] = {}
    for name, value in environ_request.form.items(multi=True):
        if name in parts:
            raise NotCacheable(f"multipart part {name!r} appears twice")
        parts[name] = (value.encode("utf-8"), None)
    for name, storage in environ_request.files.items(multi=True):
        if name in parts:
            raise NotCacheable(f"multipart part {name!r} appears twice")
        parts[name] = (storage.read(), storage.mimetype or None)
    if set(parts) - {"request", "query"} or "request" not in parts:
        raise NotCacheable("multipart body must hold a 'request' part and at most a 'query' part")
    canon_req = canonical_request(*parts["request"])
    canon_query = canonical_query(*parts["query"]) if "query" in parts else None
    return canon_req, canon_query


def _read_up_to(stream: IO[bytes], limit: int) -> tuple[bytes, bool]:
    """At most limit + 1 bytes of a body, and whether that was all of it."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = stream.read(min(64 * 1024, limit + 1 - size))
        if not chunk:
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


def runtime_of(app: Flask) -> ProxyRuntime:
    runtime: ProxyRuntime = app.extensions[EXTENSION]
    return runtime
