"""The PDP's HTTP face: health, decisions (POST /pdp) and the PAP (/policies).

The routes are module-level functions; `create_pdp_blueprint` gives an app a blueprint over
them and keeps its parameters (`PdpRoutes`) in the app's extensions, where each route finds
them (`current_pdp()`). A route answers only what it was asked for: what went wrong it raises
as a kind (`pdp.refusals`, the PDP's own errors), and the HTTP layer's one error table
(`pdp.http.errors`) gives its status and the one JSON error body.

Two rules shape this module. The subject of a decision is the authenticated caller: the
request's subject-id and role attributes are overwritten with the token's identity before the
engine sees them. And nothing a client sends can produce a 500: every parse, load or store
error maps to a 4xx that says what went wrong and where.

Who may change which policy is one function (`pdp.manage`); the blueprint takes it as a
parameter so that the PEP can widen it (stream owners for the policies about their streams)
without touching this module. A falsy `Veto` answer becomes a 403 that carries its reason.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from flask import Blueprint, Response as FlaskResponse, current_app, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from pdp.auth import Identity
from pdp.engine import PolicyInfo, PolicySource, inspect_policy
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.http.auth import current_identity, require_identity
from pdp.http.errors import no_content
from pdp.manage import ManagedPolicy, ManagePolicy, Veto, may_manage_policy
from pdp.numbers import INT64_MAX, parse_int
from pdp.policy_parser import is_version
from pdp.policy_scope import RESOURCE_CATEGORY, RESOURCE_ID
from pdp.refusals import (
    Conflict, Gone, InputTooLarge, InvalidInput, NotAcceptable, NotFound, NotPermitted,
    Unavailable, UnsupportedMedia,
)
from pdp.request import bind_environment, bind_subject, media_kind, parse_request
from pdp.response import render_response
from pdp.results import STATUS_SYNTAX_ERROR, Decision, Response, Result, Status
from pdp.service import PolicyIdMismatchError, PolicyService, Prospect
from pdp.store import PolicyExistsError, PolicyNotFoundError, StoredPolicy

log = logging.getLogger(__name__)


XACML_XML = "application/xacml+xml"
XACML_JSON = "application/xacml+json"
_OFFERED = {"xml": (XACML_XML, "application/xml", "text/xml"),
            "json": (XACML_JSON, "application/json")}


STORED_NOT_YOURS = ("it was written by someone else and is not confined to what you manage; "
                    "why is not said, as it would tell what the document holds")


def _refused(identity: Identity, what: str, verdict: object,
             writer: str | None = None) -> NotPermitted:
    """The refusal (403) saying why. When the document judged is a stored one (`writer` wrote it), the reason
    is said only to its writer and administrators: a rule's reason quotes the document (the
    streams it is about, the events it reads), which is its writer's to know."""
    reason = verdict.reason if isinstance(verdict, Veto) else None
    if reason and writer is not None and not identity.admin and writer != identity.subject:
        reason = STORED_NOT_YOURS
    message = f"{identity.subject!r} may not {what}"
    return NotPermitted(f"{message}: {reason}" if reason else message)


def _request_kind() -> str | None:
    """'xml' / 'json' from Content-Type, None when it is neither (-> 415)."""
    try:
        return media_kind(request.headers.get("Content-Type", ""))
    except RequestSyntaxError:
        return None


def _response_media_type(request_kind: str) -> str | None:
    """Pick the response format from Accept; the request's format wins ties and `*/*`."""
    if not request.headers.get("Accept"):
        return _OFFERED[request_kind][0]
    other = "json" if request_kind == "xml" else "xml"
    # For `*/*` werkzeug keeps the first offer, i.e. the request's own XACML media type.
    return request.accept_mimetypes.best_match(list(_OFFERED[request_kind]) + list(_OFFERED[other]))


def _xacml(response: Response, media_type: str, status: int = 200) -> FlaskResponse:
    return FlaskResponse(render_response(response, media_type), status=status,
                         content_type=media_type)


def read_body() -> bytes:
    """The request body, refusing one over MAX_CONTENT_LENGTH even when it came chunked
    (werkzeug then stops at the limit and returns what it read instead of raising)."""
    data = request.get_data(cache=False)
    limit = request.max_content_length
    if limit is not None and len(data) >= limit:
        raise RequestEntityTooLarge()
    return data


@dataclass(frozen=True)
class PolicyFormat:
    """Another way to write a policy than XACML (the gateway's: sharing rules).

    `to_xacml(body, media_type, identity, policy_id)` gives the XACML document the body stands
    for (`policy_id`: the id a PUT names, None for a POST) and warnings for the answer; the
    document is then judged, checked, stored and decided like any other. It may raise, and the
    app's error handlers answer (a 4xx naming what is wrong). `from_xacml(document,
    media_type)` gives a stored document in this form, or None when it cannot be written so."""

    media_types: tuple[str, ...]
    to_xacml: Callable[[bytes, str, Identity, "str | None"], "tuple[bytes, list[str]]"]
    from_xacml: Callable[[bytes, str], bytes | None]


def _policy_body(identity: Identity, formats: Sequence[PolicyFormat] = (),
                 policy_id: str | None = None) -> tuple[bytes, list[str]]:
    """The XACML document of a write, the body itself or what a PolicyFormat makes of it, and
    the format's warnings."""
    content_type = request.headers.get("Content-Type", "")
    base = content_type.split(";", 1)[0].strip().lower()
    form = next((f for f in formats if base in f.media_types), None)
    if base not in _OFFERED["xml"] and form is None:
        others = "".join(f", or {', '.join(f.media_types)}" for f in formats)
        raise UnsupportedMedia(f"unsupported Content-Type {content_type!r}: send the XACML "
                               f"policy as {XACML_XML}{others}")
    body = read_body()
    if not body.strip():
        raise InvalidInput("empty body: expected a XACML Policy or PolicySet document"
                           if form is None else f"empty body: expected a {base} document")
    return form.to_xacml(body, base, identity, policy_id) if form is not None else (body, [])


def _dry_run() -> bool:
    return request.args.get("dry_run", "").lower() in ("1", "true", "yes")


def _store_version(text: str | None) -> int | None:
    """The `store_version` query parameter: ASCII digits within SQLite's INTEGER."""
    if not text:
        return None
    return parse_int(text, "query parameter 'store_version'", high=INT64_MAX)


def _stored_json(stored: StoredPolicy) -> dict:
    return {"id": stored.policy_id, "version": stored.version,
            "store_version": stored.store_version}


CheckPolicy = Callable[[bytes, str], list[str]]


def decide_as(service: PolicyService, identity: Identity, ctx, environment=None) -> Response:
    """A request decided as the authenticated caller, on the gateway's clock and environment:
    what POST /pdp answers (its route and its fast path, pep/http/fast_pdp.py, both call this).
    `environment(resource_ids)` is asked with the request's resource-id values, so that the
    embedder can hand a decision only what concerns the resource it is about."""
    ctx = bind_subject(ctx, identity)
    attributes = environment(ctx.values(RESOURCE_CATEGORY, RESOURCE_ID)) \
        if environment is not None else []
    ctx = bind_environment(ctx, attributes)
    return service.decide(ctx)


# the embedder's environment attributes for a request naming these resource-ids
Environment = Callable[[list[str]], list[tuple[str, str, list[str]]]]
MAX_BULK = 10_000


WhatIf = Callable[[Identity, Prospect], dict]
Describe = Callable[[StoredPolicy], dict]


def create_pdp_blueprint(service: PolicyService,
                         may_manage: ManagePolicy = may_manage_policy,
                         check_policy: CheckPolicy | None = None,
                         environment: Environment | None = None,
                         health_details: Callable[[], dict] | None = None,
                         formats: Sequence[PolicyFormat] = (),
                         what_if: WhatIf | None = None,
                         describe: Describe | None = None) -> Blueprint:
    """Routes: GET /health, POST /pdp, and the PAP under /policies.

    `health_details()` adds the embedder's own parts to GET /health (the gateway: its streams);
    a non-empty `problems` list among them makes the status `degraded` (still 200: decisions
    are served, so a load balancer should not take the gateway out).

    `check_policy(document, source)` runs before a policy is written: it returns warnings for the answer
    or raises PolicyLoadError (400) when the policy cannot work (the gateway checks obligations
    against stream schemas). `environment(resource_ids)` gives the gateway's own environment
    attributes for a request naming those resource-ids, which a decision sees instead of the
    request's (`pdp.request.bind_environment`).

    `formats` are other media types a policy may be written in (and read back as, by Accept).
    `describe(stored)` adds fields to each policy of GET /policies and to a write's answer (the
    gateway: a one-line summary of what it grants). A write with `?dry_run=true` is judged and
    checked exactly as the write, then answered 200 with what it would do (`what_if(identity,
    prospect)`, the change computed against the live engine) and nothing is applied."""
    bp = Blueprint("pdp", __name__)
    routes = PdpRoutes(service, may_manage, check_policy, environment, health_details,
                       tuple(formats), what_if, describe)
    bp.record_once(lambda state: state.app.extensions.__setitem__(PDP_EXTENSION, routes))
    bp.before_request(engine_loaded)
    bp.add_url_rule("/health", view_func=health, methods=["GET"])
    bp.add_url_rule("/pdp", view_func=decide, methods=["POST"])
    bp.add_url_rule("/policies", view_func=list_policies, methods=["GET"])
    bp.add_url_rule("/policies", view_func=add_policy, methods=["POST"])
    # ids may hold "//"
    bp.add_url_rule("/policies/<path:policy_id>", view_func=get_policy, methods=["GET"],
                    merge_slashes=False)
    bp.add_url_rule("/policies/<path:policy_id>", view_func=update_policy, methods=["PUT"],
                    merge_slashes=False)
    bp.add_url_rule("/policies/bulk", view_func=add_policies, methods=["POST"])
    bp.add_url_rule("/policies/<path:policy_id>", view_func=delete_policy, methods=["DELETE"],
                    merge_slashes=False)
    return bp


PDP_EXTENSION = "xsg.pdp"  # app.extensions: the PdpRoutes of the app's PDP blueprint


@dataclass(frozen=True)
class PdpRoutes:
    """What the PDP's routes work with (the parameters of `create_pdp_blueprint`), kept in the
    app's extensions: the routes are module-level functions that find it with `current_pdp()`."""

    service: PolicyService
    may_manage: ManagePolicy = may_manage_policy
    check_policy: CheckPolicy | None = None
    environment: Environment | None = None
    health_details: Callable[[], dict] | None = None
    formats: Sequence[PolicyFormat] = ()
    what_if: WhatIf | None = None
    describe: Describe | None = None

    def described(self, stored: StoredPolicy) -> dict:
        return self.describe(stored) if self.describe is not None else {}

    def dry_run_answer(self, identity: Identity, prospect: Prospect, **fields) -> FlaskResponse:
        report = self.what_if(identity, prospect) if self.what_if is not None else None
        return jsonify({"dry_run": True, "change": prospect.kind, "id": prospect.policy_id,
                        **fields, "what_if": report})

    def checked(self, body: bytes, source: str = "request body") -> list[str]:
        return self.check_policy(body, source) if self.check_policy is not None else []

    def writer_of(self, policy_id: str) -> str:
        """Who wrote the stored current version ("" when it cannot be read: no reason then)."""
        try:
            return self.service.get(policy_id).owner
        except PolicyNotFoundError:
            return ""

    def existing_info(self, policy_id: str,
                      stored: StoredPolicy | None = None) -> ManagedPolicy | None:
        """The live policy with its stored current document; None when there is none."""
        info = self.service.policy_info(policy_id)
        if info is None:
            return None
        if stored is None:
            try:
                stored = self.service.get(policy_id)
            except PolicyNotFoundError:
                return None
        return ManagedPolicy.of(info, stored.data)


def current_pdp() -> PdpRoutes:
    """The PDP of the app serving the current request."""
    return current_app.extensions[PDP_EXTENSION]


def engine_loaded() -> FlaskResponse | None:
    """Every PDP route but /health waits for the engine (503 until it is loaded)."""
    pdp = current_pdp()
    if not pdp.service.ready and request.endpoint != "pdp.health":
        raise Unavailable("policy engine not loaded; see GET /health")
    return None


def health():
    pdp = current_pdp()
    if not pdp.service.ready:
        # the health document itself, not an error body: its `status` is the engine's state
        response = jsonify(status="starting", error="policy engine not loaded")
        response.status_code = 503
        return response
    details = pdp.health_details() if pdp.health_details is not None else {}
    status = "degraded" if details.get("problems") else "ready"
    return jsonify(status=status, policies=len(pdp.service.engine.policies),
                   store_version=pdp.service.store.store_version(), **details)


@require_identity()
def decide():
    """Decide a XACML request, as the authenticated caller (whatever subject it names).
    ---
    post:
      requestBody:
        required: true
        content:
          application/xacml+xml:
            schema: {$ref: '#/components/schemas/XacmlXml'}
          application/xacml+json:
            schema: {$ref: '#/components/schemas/XacmlJson'}
      responses:
        200:
          description: the XACML response, in the format Accept asks for (else the request's)
          content:
            application/xacml+xml: {}
            application/xacml+json: {}
        400:
          description: a request that does not parse; a XACML response with syntax-error
        415:
          description: not a XACML media type
    """
    pdp = current_pdp()
    kind = _request_kind()
    if kind is None:
        raise UnsupportedMedia("unsupported Content-Type "
                               f"{request.headers.get('Content-Type')!r}: use {XACML_XML} "
                               f"or {XACML_JSON}")
    media_type = _response_media_type(kind)
    if media_type is None:
        raise NotAcceptable(f"cannot answer in {request.headers.get('Accept')!r}: "
                            f"{XACML_XML} and {XACML_JSON} are offered")
    try:
        ctx = parse_request(read_body(), request.headers["Content-Type"])
    except RequestSyntaxError as exc:
        status = Status(code=STATUS_SYNTAX_ERROR, message=str(exc))
        answer = Response(results=(Result(decision=Decision.INDETERMINATE, status=status),))
        return _xacml(answer, media_type, 400)
    return _xacml(decide_as(pdp.service, current_identity(), ctx, pdp.environment), media_type)


@require_identity()
def list_policies():
    pdp = current_pdp()
    identity = current_identity()
    visible = []
    for stored in pdp.service.list():
        info = pdp.existing_info(stored.policy_id, stored)
        if info is not None and pdp.may_manage(identity, info):
            visible.append({**stored.summary(), **pdp.described(stored)})
    return jsonify(visible)


@require_identity()
def add_policy():
    """Add a policy: XACML, or another form (`formats`); `?dry_run=true` says what it
    would do to the live handles and stores nothing.
    ---
    post:
      parameters:
        - {name: dry_run, in: query, schema: {type: boolean}}
      requestBody:
        required: true
        content:
          application/xacml+xml:
            schema: {$ref: '#/components/schemas/XacmlXml'}
      responses:
        201: {description: '{"id", "version", "store_version", "warnings"}'}
    """
    pdp = current_pdp()
    identity = current_identity()
    body, warnings = _policy_body(identity, pdp.formats)
    try:
        info = ManagedPolicy.of(inspect_policy(PolicySource("request body", body)), body)
        verdict = pdp.may_manage(identity, info)
        if not verdict:
            raise _refused(identity, f"manage policy {info.id!r}", verdict)
        warnings = warnings + pdp.checked(body)
        if _dry_run():
            prospect = pdp.service.prospect("added", info.id, body, source="request body")
            return pdp.dry_run_answer(identity, prospect, version=info.version,
                                      warnings=warnings)
        stored = pdp.service.add(body, owner=identity.subject, source="request body")
    except PolicyLoadError as exc:
        raise InvalidInput.of(exc) from None
    except PolicyExistsError as exc:
        raise Conflict(f"{exc}; use PUT /policies/<id> to publish a new version",
                       id=exc.policy_id) from None
    response = jsonify({**_stored_json(stored), **pdp.described(stored), "warnings": warnings})
    response.status_code = 201
    location = quote(stored.policy_id, safe='')
    response.headers["Location"] = f"{request.root_path}/policies/{location}"
    return response


@require_identity()
def get_policy(policy_id: str):
    """A policy's current document (XACML XML), an earlier version (`version`,
    `store_version`), or its history (`history=true`, JSON).
    ---
    get:
      parameters:
        - {name: version, in: query, schema: {type: string, pattern: '^[0-9]+(\\.[0-9]+)*$'}}
        - {name: store_version, in: query, schema: {type: integer, minimum: 0}}
        - {name: history, in: query, schema: {type: boolean}}
      responses:
        200:
          description: the document, or the history
          content:
            application/xacml+xml: {}
            application/json: {}
    """
    pdp = current_pdp()
    identity = current_identity()
    wants_history = request.args.get("history", "").lower() in ("1", "true", "yes")
    offered = ["application/json"] if wants_history else [
        XACML_XML, "application/xml", *(t for f in pdp.formats for t in f.media_types)]
    chosen = request.accept_mimetypes.best_match(offered) \
        if request.headers.get("Accept") else offered[0]
    if chosen is None:
        raise NotAcceptable(f"this resource is {' or '.join(offered)}")
    info = pdp.existing_info(policy_id)
    if info is None:
        # A deleted policy's history stays readable by administrators.
        if not identity.admin:
            raise PolicyNotFoundError(policy_id)
    else:
        verdict = pdp.may_manage(identity, info)
        if not verdict:
            raise _refused(identity, f"read policy {policy_id!r}", verdict,
                           pdp.writer_of(policy_id))
    if wants_history:
        return jsonify([p.summary() for p in pdp.service.history(policy_id)])
    store_version = _store_version(request.args.get("store_version"))
    version = request.args.get("version")
    if version is not None and not is_version(version):
        raise InvalidInput(f"query parameter 'version' must be a XACML version "
                           f"(ASCII numbers joined by dots, e.g. 1.0), not {version[:40]!r}")
    stored = pdp.service.get(policy_id, version=version, store_version=store_version)
    if stored.deleted:
        raise Gone(f"policy {policy_id!r} store version {stored.store_version} is a deletion",
                   store_version=stored.store_version)
    if info is not None and stored.data != info.data:
        # An earlier version is judged on its own document: managing a policy's id today
        # does not open what others wrote under it before.
        verdict = pdp.may_manage(identity, ManagedPolicy.of(info, stored.data))
        if not verdict:
            raise _refused(identity, f"read this version of policy {policy_id!r}", verdict,
                           stored.owner)
    form = next((f for f in pdp.formats if chosen in f.media_types), None)
    if form is not None:
        written = form.from_xacml(stored.data, chosen)
        if written is None:
            raise NotAcceptable(f"policy {policy_id!r} cannot be shown as {chosen}: "
                                f"it is custom XACML; read it as {XACML_XML}")
        response = FlaskResponse(written, content_type=chosen)
    else:
        response = FlaskResponse(stored.data, content_type=XACML_XML)
    response.headers["X-Policy-Version"] = stored.version
    response.headers["X-Store-Version"] = str(stored.store_version)
    return response


@require_identity()
def update_policy(policy_id: str):
    """Publish a new version: XACML or another form; `?dry_run=true` as for POST.
    ---
    put:
      parameters:
        - {name: dry_run, in: query, schema: {type: boolean}}
      requestBody:
        required: true
        content:
          application/xacml+xml:
            schema: {$ref: '#/components/schemas/XacmlXml'}
    """
    pdp = current_pdp()
    identity = current_identity()
    body, warnings = _policy_body(identity, pdp.formats, policy_id)
    current = pdp.existing_info(policy_id)
    if current is None:
        raise NotFound(f"policy {policy_id!r} not found; use POST /policies to add it")
    try:
        info = ManagedPolicy.of(inspect_policy(PolicySource("request body", body)), body)
        if info.id != policy_id:
            raise PolicyIdMismatchError(policy_id, info.id)
        verdict = pdp.may_manage(identity, current)
        if not verdict:
            raise _refused(identity, f"manage policy {policy_id!r} (its current version)",
                           verdict, pdp.writer_of(policy_id))
        verdict = pdp.may_manage(identity, info)
        if not verdict:
            raise _refused(identity, f"manage policy {policy_id!r} (the new version)", verdict)
        warnings = warnings + pdp.checked(body)
        if _dry_run():
            prospect = pdp.service.prospect("updated", policy_id, body, source="request body")
            return pdp.dry_run_answer(identity, prospect, version=info.version,
                                      warnings=warnings)
        stored = pdp.service.update(policy_id, body, owner=identity.subject,
                                    source="request body")
    except PolicyLoadError as exc:
        raise InvalidInput.of(exc) from None
    except PolicyIdMismatchError as exc:
        raise InvalidInput(str(exc), id=exc.found) from None
    return jsonify({**_stored_json(stored), **pdp.described(stored), "warnings": warnings})


@require_identity()
def add_policies():
    """Many new policies at once, all or none: `multipart/form-data`, one file part per
    XACML policy document. Each is judged and checked as POST /policies would; then they
    are added in one transaction and one engine change.
    ---
    post:
      requestBody:
        required: true
        content:
          multipart/form-data:
            schema:
              type: object
              properties:
                policy: {type: string, format: binary}
                other: {type: string, format: binary}
      responses:
        201: {description: '{"policies": [...], "warnings": [...]}'}
    """
    pdp = current_pdp()
    if request.mimetype != "multipart/form-data":
        raise UnsupportedMedia("send the policies as multipart/form-data, one file part "
                               "per XACML Policy or PolicySet document")
    parts = [(name, f) for name in request.files for f in request.files.getlist(name)]
    if not parts:
        raise InvalidInput("no policy documents: send one file part per policy")
    if len(parts) > MAX_BULK:
        raise InputTooLarge(f"{len(parts)} documents; at most {MAX_BULK} at once")
    identity = current_identity()
    sources, warnings = [], []
    for n, (field, part) in enumerate(parts, 1):
        label = f"part {n} ({part.filename or field})"
        data = part.read()
        try:
            info = ManagedPolicy.of(inspect_policy(PolicySource(label, data)), data)
            verdict = pdp.may_manage(identity, info)
            if not verdict:
                raise _refused(identity, f"manage policy {info.id!r} ({label})", verdict)
            warnings.extend(f"{label}: {w}" for w in pdp.checked(data, label))
        except PolicyLoadError as exc:
            raise InvalidInput.of(exc) from None
        sources.append(PolicySource(label, data))
    try:
        written = pdp.service.add_many(sources, owner=identity.subject)
    except PolicyLoadError as exc:
        raise InvalidInput.of(exc) from None
    except PolicyExistsError as exc:
        raise Conflict(f"{exc}; nothing was added", id=exc.policy_id) from None
    response = jsonify(policies=[_stored_json(s) for s in written], warnings=warnings)
    response.status_code = 201
    return response


@require_identity()
def delete_policy(policy_id: str):
    pdp = current_pdp()
    identity = current_identity()
    current = pdp.existing_info(policy_id)
    if current is None:
        raise PolicyNotFoundError(policy_id)
    verdict = pdp.may_manage(identity, current)
    if not verdict:
        raise _refused(identity, f"manage policy {policy_id!r}", verdict,
                       pdp.writer_of(policy_id))
    try:
        if _dry_run():
            return pdp.dry_run_answer(identity, pdp.service.prospect("deleted", policy_id))
        pdp.service.delete(policy_id, owner=identity.subject)
    except PolicyLoadError as exc:  # e.g. still referenced by a PolicySet
        raise Conflict.of(exc) from None
    return no_content()
