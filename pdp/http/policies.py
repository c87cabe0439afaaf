"""The PAP: /policies, where a caller reads and writes the policies `pdp.manage` lets them
manage, in XACML or another form (`PolicyFormat`), one at a time or many in one transaction.

Who may change which policy is one function (`PdpRoutes.may_manage`); a falsy `Veto` answer is
a refusal (403) that carries its reason. A write with `?dry_run=true` is judged and checked
exactly as the write, then answered with what it would do, and nothing is applied."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from flask import Response as FlaskResponse, jsonify, request

from common.auth import Identity
from common.http.auth import current_identity, require_identity
from common.http.errors import no_content
from common.numbers import INT64_MAX, parse_int
from common.refusals import (
    Conflict,
    Gone,
    InputTooLarge,
    InvalidInput,
    NotAcceptable,
    NotFound,
    NotPermitted,
    UnsupportedMedia,
)
from pdp.engine import PolicySource, inspect_policy
from pdp.errors import PolicyLoadError
from pdp.http.context import OFFERED, XACML_XML, PolicyFormat, current_pdp, read_body
from pdp.manage import ManagedPolicy, Veto
from pdp.policy_parser import is_version
from pdp.service import PolicyIdMismatchError
from pdp.store import PolicyExistsError, PolicyNotFoundError, StoredPolicy

STORED_NOT_YOURS = ("it was written by someone else and is not confined to what you manage; "
                    "why is not said, as it would tell what the document holds")


def _refused(identity: Identity, what: str, verdict: object,
             writer: str | None = None) -> NotPermitted:
    """The refusal (403) saying why. When the document judged is a stored one (`writer` wrote
    it), the reason is said only to its writer and administrators: a rule's reason quotes the
    document (the streams it is about, the events it reads), which is its writer's to know."""
    reason = verdict.reason if isinstance(verdict, Veto) else None
    if reason and writer is not None and not identity.admin and writer != identity.subject:
        reason = STORED_NOT_YOURS
    message = f"{identity.subject!r} may not {what}"
    return NotPermitted(f"{message}: {reason}" if reason else message)


def _policy_body(identity: Identity, formats: Sequence[PolicyFormat] = (),
                 policy_id: str | None = None) -> tuple[bytes, list[str]]:
    """The XACML document of a write, the body itself or what a PolicyFormat makes of it, and
    the format's warnings."""
    content_type = request.headers.get("Content-Type", "")
    base = content_type.split(";", 1)[0].strip().lower()
    form = next((f for f in formats if base in f.media_types), None)
    if base not in OFFERED["xml"] and form is None:
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


def _stored_json(stored: StoredPolicy) -> dict[str, Any]:
    return {"id": stored.policy_id, "version": stored.version,
            "store_version": stored.store_version}


MAX_BULK = 10_000


@require_identity()
def list_policies() -> FlaskResponse:
    pdp = current_pdp()
    identity = current_identity()
    visible = []
    for stored in pdp.service.list():
        info = pdp.existing_info(stored.policy_id, stored)
        if info is not None and pdp.may_manage(identity, info):
            visible.append({**stored.summary(), **pdp.described(stored)})
    return jsonify(visible)


@require_identity()
def add_policy() -> FlaskResponse:
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
def get_policy(policy_id: str) -> FlaskResponse:
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
            # named with the word GET /policies gives the policy (`form`), when there is one
            kind = pdp.described(stored).get("form")
            what = f"its form is {kind!r}" if isinstance(kind, str) else \
                "it cannot be written so"
            raise NotAcceptable(f"policy {policy_id!r} cannot be shown as {chosen}: {what}; "
                                f"read it as {XACML_XML}",
                                **({"form": kind} if isinstance(kind, str) else {}))
        response = FlaskResponse(written, content_type=chosen)
    else:
        response = FlaskResponse(stored.data, content_type=XACML_XML)
    response.headers["X-Policy-Version"] = stored.version
    response.headers["X-Store-Version"] = str(stored.store_version)
    return response


@require_identity()
def update_policy(policy_id: str) -> FlaskResponse:
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
def add_policies() -> FlaskResponse:
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
    sources: list[PolicySource] = []
    warnings: list[str] = []
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
def delete_policy(policy_id: str) -> FlaskResponse:
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

