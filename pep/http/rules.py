"""Sharing rules over HTTP: written, read back, summarised, previewed, and what a change would do.

- **Writing**: `POST /policies` and `PUT /policies/<id>` take a rule as
  `application/vnd.xsg.rule+json` or `application/vnd.xsg.rule+yaml` besides XACML. The rule is
  read (errors name the field: `{"error": "/window/size: ...", "field": "/window/size"}`, 400),
  its stream must be the caller's (administrators: any registered stream; anyone else gets the
  same 403 for a stream that is not theirs and one that does not exist, so nothing is learnt of
  other owners' streams), it is checked against the stream's schema, compiled to XACML
  (`pep.core.rules`), and from there on it is a policy like any other: judged by the same
  ownership rule, checked, stored, versioned, decided and revoked. A PUT's rule without an `id`
  takes the id in the URL.
- **Reading back**: `GET /policies/<id>` with `Accept: application/vnd.xsg.rule+json` (or
  `+yaml`) gives the rule a stored document is (the decompiler), or 406 naming the policy's
  `form` when it is not a rule (`xacml` or `custom`, the words of the summaries). The XACML is
  always there too, and may be edited by hand: if it keeps the rule's shape it still reads
  back as a rule.
- **Summaries**: every policy of `GET /policies` and every write's answer carry `summary`, one
  line saying what it grants, and `form`: `rule`, `xacml` (hand-written but read by its
  grants) or `custom`.
- **What-if** (`?dry_run=true` on POST, PUT and DELETE /policies): the change is judged and
  checked exactly as the real one, computed against the live engine (`PolicyService.prospect`)
  and the live handles it would re-decide are decided again (`RevocationService.what_if`) and
  nothing is applied. The answer counts them (`revoked`: no longer permitted; `changed`: still
  permitted, but the obligations changed, so the handle would be revoked and its consumer
  would have to ask again; `kept`) and lists them per consumer and stream. An administrator
  sees every handle; anyone else only handles that read one of their own streams (a stream
  owner's policies are confined to its streams, so nothing it can change is left out), never
  another owner's consumers. Never handle ids.
- **Preview** (`POST /rules/preview`): a rule compiled without storing anything: its XACML, its
  summary, its warnings and, for a sample consumer the caller describes (subject, roles,
  attributes; never looked up: what other subjects carry is not the caller's to read), what
  `POST /explain` would answer that consumer if the rule were saved (decided against the live
  policies with the rule added or replacing its current version).
"""
from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import yaml
from flask import Blueprint, Flask, Response, current_app, jsonify, request
from lxml import etree

from common.auth import AuthFileError, Identity, parse_identity_attributes
from common.http.auth import current_identity, require_identity
from pdp import (
    ManagedPolicy,
    PolicyExistsError,
    PolicyLoadError,
    PolicyNotFoundError,
    PolicySource,
    Prospect,
    StoredPolicy,
    inspect_policy,
)
from pdp.http import PolicyFormat, read_body
from pep.core.access import RESOURCE, RESOURCE_ID
from pep.core.errors import InvalidInput, NotPermitted, Refusal, UnsupportedMedia
from pep.core.rules import (
    RuleError,
    SharingRule,
    check_rule,
    describe_policy,
    rule_from_json,
    rule_from_xacml,
    rule_to_json,
    rule_to_xacml,
)
from pep.core.rules.model import RuleJson
from pep.core.rules.reading import read_policy
from pep.core.rules.summary import reading_text
from pep.core.rules.xacml import ACTION, ACTION_ID, NS, STRING, SUBJECT, SUBJECT_ID
from pep.http.errors import status_of
from pep.streams.ownership import owner_or_admin
from pep.streams.policy_check import check_policy, derived_rule_warnings

if TYPE_CHECKING:  # pep.services wires this module in (`pep.http.app`): no import at run time
    from pep.services import GatewayServices

RULE_JSON = "application/vnd.xsg.rule+json"
RULE_YAML = "application/vnd.xsg.rule+yaml"
RULE_TYPES = (RULE_JSON, RULE_YAML)
MAX_SUMMARIES = 20_000


# -- reading rule documents ------------------------------------------------------------------------

# PyYAML has no stubs here (types-PyYAML is no dependency): its SafeLoader is Any to mypy
class _RuleLoader(yaml.SafeLoader):  # type: ignore[misc]  # subclassing Any, see above
    """YAML without aliases (their expansion is how a small document becomes a huge one) and
    without implicit timestamps (a `from:` stays the text the owner wrote)."""

    def compose_node(self, parent: object, index: object) -> object:  # PyYAML's hook
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(None, None, "aliases (*name) are not allowed in a rule",
                                       event.start_mark)
        return super().compose_node(parent, index)


_RuleLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a rule can hold")


def load_rule_document(body: bytes, media_type: str) -> Any:
    """The JSON or YAML value of a rule document; InvalidInput says where it does not parse."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the rule is not UTF-8 text (byte {exc.start})") from None
    try:
        if media_type == RULE_YAML:
            return yaml.load(text, Loader=_RuleLoader)  # noqa: S506 - a SafeLoader subclass
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the rule is not JSON: {exc.msg} at line {exc.lineno}, column "
                           f"{exc.colno}", line=exc.lineno, column=exc.colno) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidInput(f"the rule is not YAML: {problem}{where}",
                           line=mark.line + 1 if mark else None) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the rule cannot be read: {str(exc) or 'nested too deeply'}") from None


def dump_rule(rule: SharingRule, media_type: str) -> bytes:
    data = rule_to_json(rule)
    if media_type == RULE_YAML:
        text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        return text.encode("utf-8")
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# -- the gateway's rules ---------------------------------------------------------------------------

class WhatIfConsumer(TypedDict):
    """One consumer's handles on some streams that a change would treat alike."""

    subject: str
    streams: list[str]
    outcome: str  # revoked, changed or kept (`WhatIf.outcome`)
    reason: str | None
    handles: int


class WhatIfReport(TypedDict):
    """What a dry run's change would do to the live handles the caller may hear of."""

    handles: int
    revoked: int
    changed: int
    kept: int
    consumers: list[WhatIfConsumer]


class RulePreview(TypedDict):
    """`POST /rules/preview`'s answer."""

    rule: RuleJson
    xacml: str
    summary: str | None
    warnings: list[str]
    change: Literal["added", "updated"]
    explain: dict[str, object] | None


class Rules:
    """Sharing rules over the gateway's services: the policy format, the summaries, the
    what-if report and the preview (see the module docstring)."""

    def __init__(self, services: GatewayServices) -> None:
        self.services = services
        self._summaries: dict[tuple[str, int], dict[str, str]] = {}

    # reading and compiling

    def rule_of(self, value: Any, identity: Identity, policy_id: str | None = None
                ) -> tuple[SharingRule, list[str]]:
        """A rule read, its stream the caller's, checked against the stream: (rule, warnings)."""
        if isinstance(value, dict) and policy_id is not None and value.get("id") is None:
            value = {**value, "id": policy_id}
        rule = rule_from_json(value)
        stream = self.services.catalog.get(rule.stream)
        if not owner_or_admin(identity, stream.owner if stream is not None else None):
            raise NotPermitted(f"{identity.subject!r} may not write rules on stream "
                               f"{rule.stream!r}: it is not a stream of theirs", field="/stream")
        if stream is None:
            raise RuleError("/stream", f"no stream named {rule.stream!r} is registered")
        events = {d.name for d in self.services.stream_events.all(stream.name)}
        # a derived stream's rule: first what it asks beyond the grant it derives from
        derived = self.services.derived
        derivation = derived.derivation(stream.name) if derived is not None else None
        wider = (derived_rule_warnings(rule_to_xacml(rule), derivation)
                 if derivation is not None else [])
        return rule, wider + check_rule(rule, stream, events)

    def to_xacml(self, body: bytes, media_type: str, identity: Identity,
                 policy_id: str | None) -> tuple[bytes, list[str]]:
        rule, warnings = self.rule_of(load_rule_document(body, media_type), identity, policy_id)
        return rule_to_xacml(rule), warnings

    @staticmethod
    def from_xacml(document: bytes, media_type: str) -> bytes | None:
        rule = rule_from_xacml(document)
        return dump_rule(rule, media_type) if rule is not None else None

    def policy_format(self) -> PolicyFormat:
        return PolicyFormat(RULE_TYPES, self.to_xacml, self.from_xacml)

    # summaries

    def describe(self, stored: StoredPolicy) -> dict[str, str]:
        """`summary` and `form` of a stored version, computed once per store version."""
        key = (stored.policy_id, stored.store_version)
        found = self._summaries.get(key)
        if found is None:
            found = describe_policy(stored.data)
            if len(self._summaries) >= MAX_SUMMARIES:
                self._summaries.clear()
            self._summaries[key] = found
        return found

    # what-if

    def what_if(self, identity: Identity, prospect: Prospect) -> WhatIfReport:
        """What the change would do to the live handles this caller may hear of."""
        report = self.services.revocation.what_if(prospect, prospect.engine)
        catalog = self.services.catalog

        def owned(name: str) -> bool:
            stream = catalog.get(name)
            return stream is not None and stream.owner == identity.subject

        counts: Counter[str] = Counter()
        groups: dict[tuple[str, tuple[str, ...], str, str], int] = {}
        for record, verdict in report.outcomes:
            mine = [owned(name) for name in record.streams]
            if not identity.admin and not any(mine):
                continue
            outcome = report.outcome(verdict)
            counts[outcome] += 1
            reason = verdict.reason or ""
            if reason and not identity.admin and not all(mine):
                # a join with another owner's stream: why its side would fail is not ours to say
                reason = "a join with a stream of another owner, decided again"
            key = (record.subject, record.streams, outcome, reason)
            groups[key] = groups.get(key, 0) + 1
        order = {"revoked": 0, "changed": 1, "kept": 2}
        consumers: list[WhatIfConsumer] = [
            {"subject": subject, "streams": list(streams), "outcome": outcome,
             "reason": reason or None, "handles": n}
            for (subject, streams, outcome, reason), n in
            sorted(groups.items(), key=lambda kv: (order[kv[0][2]], kv[0][0], kv[0][1]))]
        return {"handles": sum(counts.values()), "revoked": counts["revoked"],
                "changed": counts["changed"], "kept": counts["kept"], "consumers": consumers}

    # preview

    def preview(self, data: Any, identity: Identity) -> RulePreview:
        if not isinstance(data, dict):
            raise InvalidInput("the preview is a JSON object: {\"rule\": {...}, \"consumer\": "
                               "{...}, \"action\": ...}")
        unknown = set(data) - {"rule", "consumer", "action", "query"}
        if unknown:
            raise InvalidInput(f"unknown field {sorted(unknown)[0]!r}; known: rule, consumer, "
                               "action, query", field=f"/{sorted(unknown)[0]}")
        if "rule" not in data:
            raise RuleError("/rule", "is required")
        try:
            rule, warnings = self.rule_of(data["rule"], identity)
        except RuleError as exc:
            raise RuleError("/rule" + (exc.path if exc.path != "/" else ""), exc.reason) from None
        document = rule_to_xacml(rule)
        services = self.services
        try:
            info = ManagedPolicy.of(inspect_policy(PolicySource("compiled rule", document)),
                                    document)
        except PolicyLoadError as exc:  # the compiler's output always loads; deny when in doubt
            raise InvalidInput(f"the compiled rule does not load: {exc.message}") from None
        verdict = services.may_manage(identity, info)
        if not verdict:
            raise NotPermitted(f"{identity.subject!r} may not manage policy {rule.id!r}: "
                               f"{getattr(verdict, 'reason', '')}".rstrip(": "))
        current = services.policies.policy_info(rule.id)
        change: Literal["added", "updated"] = "added"
        if current is not None:
            change = "updated"
            try:
                stored = services.policies.get(rule.id)
            except PolicyNotFoundError:
                stored = None
            if stored is None or not services.may_manage(identity,
                                                         ManagedPolicy.of(current, stored.data)):
                raise NotPermitted(f"policy {rule.id!r} exists and is not yours to replace")
        warnings = warnings + self.check(document)
        reading = read_policy(document)
        out: RulePreview = {"rule": rule_to_json(rule), "xacml": document.decode("utf-8"),
                            "summary": reading_text(reading) if reading is not None else None,
                            "warnings": warnings, "change": change, "explain": None}
        consumer = data.get("consumer")
        if consumer is not None:
            try:
                prospect = services.policies.prospect(change, rule.id, document,
                                                      source="compiled rule")
            except (PolicyExistsError, PolicyNotFoundError):
                raise InvalidInput(f"policy {rule.id!r} changed meanwhile; preview again") \
                    from None
            out["explain"] = self.explain_for(prospect, rule, self.sample_identity(consumer),
                                              data.get("action"), data.get("query"))
        return out

    def check(self, document: bytes) -> list[str]:
        catalog, derived = self.services.catalog, self.services.derived
        return check_policy(document, catalog.get, catalog.definitions, "compiled rule",
                            derivation=derived.derivation if derived is not None else None)

    @staticmethod
    def sample_identity(consumer: Any) -> Identity:
        if not isinstance(consumer, dict):
            raise InvalidInput("/consumer must be an object: {\"subject\": ..., \"roles\": [...], "
                               "\"attributes\": {...}}", field="/consumer")
        unknown = set(consumer) - {"subject", "roles", "attributes"}
        if unknown:
            name = sorted(unknown)[0]
            raise InvalidInput(f"/consumer/{name}: unknown field; known: subject, roles, "
                               "attributes", field=f"/consumer/{name}")
        subject = consumer.get("subject")
        if not isinstance(subject, str) or not subject.strip() or len(subject) > 512:
            raise InvalidInput("/consumer/subject: a subject id is required",
                               field="/consumer/subject")
        roles = consumer.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles) \
                or len(roles) > 1000:
            raise InvalidInput("/consumer/roles: must be a list of role names",
                               field="/consumer/roles")
        try:
            attributes = parse_identity_attributes(consumer.get("attributes", {}) or {},
                                                   "/consumer/attributes")
        except AuthFileError as exc:
            raise InvalidInput(str(exc), field="/consumer/attributes") from None
        return Identity(subject.strip(), tuple(roles), False, attributes)

    def explain_for(self, prospect: Prospect, rule: SharingRule, consumer: Identity,
                    action: Any, query: Any) -> dict[str, object]:
        """What POST /explain would answer `consumer` for `action` on the rule's stream, were
        the change applied. A refusal is described, not raised: explaining is the point."""
        if action is None:
            action = rule.actions[0] if rule.actions else "read"
        if not isinstance(action, str) or not action.strip() or len(action) > 1000:
            raise InvalidInput("/action: an action id is required", field="/action")
        user_query = None
        if query is not None:
            if not isinstance(query, dict):
                raise InvalidInput("/query: a user query object (as POST /requests takes it)",
                                   field="/query")
            user_query = json.dumps(query).encode()
        body = sample_request(consumer.subject, rule.stream, action.strip())
        services = self.services
        try:
            grant = services.access.decide_and_plan(
                prospect.engine, body, "application/xacml+xml", consumer,
                services.catalog.schema, user_query=user_query,
                user_query_type="application/json" if user_query else None, refuse_nr=False)
        except Refusal as exc:
            decision = getattr(exc, "decision", None)
            name = None
            if decision is not None:  # a denial, as the PDP answered it
                results = decision.results
                name = results[0].decision.value if len(results) == 1 else "Indeterminate"
            out: dict[str, object] = {
                "consumer": consumer.subject, "action": action, "decision": name,
                "status": status_of(exc), "error": exc.message}
            if "warnings" in exc.details:
                out["warnings"] = exc.details["warnings"]
            return out
        return {"consumer": consumer.subject, "action": action,
                "decision": grant.decision.results[0].decision.value, "stream": grant.stream,
                "warnings": [w.to_json() for w in grant.warnings], "plan": grant.plan_json,
                "sql": grant.sql, "policies": sorted(grant.policy_ids)}


def sample_request(subject: str, stream: str, action: str) -> bytes:
    """A XACML request for `stream` and `action` (the subject is bound from the identity)."""
    root = etree.Element(f"{{{NS}}}Request", ReturnPolicyIdList="false",
                         CombinedDecision="false", nsmap={None: NS})
    for category, attribute_id, value in ((SUBJECT, SUBJECT_ID, subject),
                                          (RESOURCE, RESOURCE_ID, stream),
                                          (ACTION, ACTION_ID, action)):
        attributes = etree.SubElement(root, f"{{{NS}}}Attributes", Category=category)
        attribute = etree.SubElement(attributes, f"{{{NS}}}Attribute", AttributeId=attribute_id,
                                     IncludeInResult="false")
        etree.SubElement(attribute, f"{{{NS}}}AttributeValue", DataType=STRING).text = value
    document: bytes = etree.tostring(root, xml_declaration=True, encoding="UTF-8")
    return document


RULES_EXTENSION = "xsg.rules"


def install_rules(app: Flask, rules: Rules) -> None:
    """`POST /rules/preview` on `app`, over these `Rules` (the same the PDP blueprint writes
    policies with)."""
    app.extensions[RULES_EXTENSION] = rules
    app.register_blueprint(bp)


# Defined once, at module level: the route reads the app's `Rules` (app.extensions).
bp = Blueprint("xsg_rules", __name__)


@bp.post("/rules/preview")
@require_identity()
def preview() -> Response:
    """A sharing rule compiled, summarised and explained for a sample consumer; nothing is
    stored.
    ---
    post:
      requestBody:
        required: true
        content:
          application/json: {}
      responses:
        200:
          description: "{rule, xacml, summary, warnings, change, explain}"
        400:
          description: a rule that does not read or fit its stream; `field` names where
        403:
          description: the stream or the policy id is not the caller's
    """
    content_type = request.headers.get("Content-Type", "")
    if content_type.split(";", 1)[0].strip().lower() not in ("application/json",):
        raise UnsupportedMedia(f"unsupported Content-Type {content_type!r}: send "
                               "application/json")
    data = load_rule_document(read_body(), RULE_JSON)
    rules: Rules = current_app.extensions[RULES_EXTENSION]
    response = jsonify(rules.preview(data, current_identity()))
    response.headers["Cache-Control"] = "no-store"
    return response


__all__ = ["Rules", "install_rules", "bp", "load_rule_document", "dump_rule", "RULE_JSON",
           "RULE_YAML", "RULE_TYPES", "sample_request"]
