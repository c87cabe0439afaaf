"""The AuthZEN Authorization API 1.0 (OpenID Foundation) over the XACML PDP: AuthZEN requests
into XACML request contexts, XACML results into AuthZEN decisions. No HTTP here
(`pdp.http.authzen` serves it).

Mapping (AuthZEN -> XACML category / attribute id):

- `subject.id` must be the authenticated caller's subject (the HTTP edge refuses another one);
  `subject.type` and `subject.properties` are checked for shape and then not used: the
  access-subject category is the caller's identity (subject-id, role, its attributes), bound
  as for POST /pdp (`pdp.request.bind_subject`).
- `resource.id` -> resource `urn:oasis:names:tc:xacml:1.0:resource:resource-id`;
  `resource.type` -> resource `urn:xsg:authzen:resource-type`; `resource.properties.K` ->
  resource attribute `K`.
- `action.name` -> action `urn:oasis:names:tc:xacml:1.0:action:action-id`;
  `action.properties.K` -> action attribute `K`.
- `context.K` -> environment attribute `K` (the gateway's clock and `urn:xsg:` attributes then
  replace what the request says of them, `pdp.request.bind_environment`).

A property's key is the attribute id, verbatim (a URN or a short name such as `department`); a
nested object is flattened with dots (`library_record.isbn`). Ids under `urn:xsg:` are the
gateway's to say (the state of stream events, the stream a request is joined with) and are
refused; the context's current-time, current-date and current-dateTime are replaced by the
gateway's clock, as on POST /pdp. Values: a string is a
`string`, a boolean a `boolean`, an integer an `integer`, another number a `double`; an array
of them is a bag (integers and doubles together: doubles); null and the empty array are no
value. Anything else (an array of objects or arrays, values of mixed types, a number that is not
finite) is refused, saying where with a JSON pointer (`AuthzenInputError.pointer`).

Decisions: Permit is `true`; Deny, NotApplicable and Indeterminate are `false` (the spec's
"closed"), with `context.reason` and `context.xacml_decision`, and for an Indeterminate the
XACML status (code, message, the missing attributes), exactly what POST /pdp would tell the same
caller of the same request. Obligations and advice, which the PEP must fulfil (xsg's stream
obligations: filters, projections, windows, masks), come in `context.obligations` and
`context.advice` with their attribute assignments; a PEP that cannot fulfil an obligation must
not act on a `true` (XACML 3.0, section 7.18).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdp.request.model import (
    DATATYPE_SHORTHANDS,
    STRING,
    CategoryInstance,
    RequestAttribute,
    RequestContext,
)
from pdp.results import STATUS_MISSING_ATTRIBUTE, STATUS_OK, Decision, Obligation, Result
from pdp.urns import ACTION, ACTION_ID, ENVIRONMENT, RESOURCE, RESOURCE_ID

RESOURCE_TYPE = "urn:xsg:authzen:resource-type"
GATEWAY_PREFIX = "urn:xsg:"  # attribute ids only the gateway gives (`pdp.request.binding`)

EXECUTE_ALL = "execute_all"
DENY_ON_FIRST_DENY = "deny_on_first_deny"
PERMIT_ON_FIRST_PERMIT = "permit_on_first_permit"
SEMANTICS = (EXECUTE_ALL, DENY_ON_FIRST_DENY, PERMIT_ON_FIRST_PERMIT)

MAX_EVALUATIONS = 1000  # one batch; as many as one XACML request's individual decisions
MAX_ATTRIBUTES = 256  # attributes one entity's properties (or the context) give, flattened
MAX_VALUES = 1024  # values in one array
MAX_PROPERTY_DEPTH = 8  # objects within properties
MAX_KEY_LENGTH = 512

_BOOLEAN = DATATYPE_SHORTHANDS["boolean"]
_INTEGER = DATATYPE_SHORTHANDS["integer"]
_DOUBLE = DATATYPE_SHORTHANDS["double"]
# what a XACML value may not hold (XML 1.0's excluded characters, lone surrogates), as for
# POST /pdp's JSON Profile requests (`pdp.request.json_form`)
_NON_XML_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


class AuthzenInputError(ValueError):
    """A request that does not follow the API; `pointer` is the JSON pointer of the field
    ("" for the whole body), `too_large` marks a refusal for size (more evaluations than
    taken at once)."""

    def __init__(self, message: str, pointer: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.pointer = pointer
        self.too_large = too_large


@dataclass(frozen=True)
class Evaluation:
    """One access evaluation: the subject it names (where, for a refusal) and the XACML request
    of its resource, action and context (no access subject: the caller's is bound later)."""

    subject_id: str
    subject_at: str  # JSON pointer of the subject's id
    request: RequestContext


@dataclass(frozen=True)
class Batch:
    """An Access Evaluations request: its evaluations in order, and how to run them. `single`:
    no `evaluations` array (or an empty one), answered as one Access Evaluation."""

    evaluations: tuple[Evaluation, ...]
    semantic: str = EXECUTE_ALL
    single: bool = False


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) of these keys and indexes."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


# ----------------------------------------------------------------------------- requests


def parse_evaluation(doc: Any) -> Evaluation:
    """The body of POST /access/v1/evaluation."""
    if not isinstance(doc, dict):
        raise AuthzenInputError(f"the body must be a JSON object, found {_kind(doc)}", "")
    return _Reader().evaluation(doc, doc, ())


def parse_evaluations(doc: Any) -> Batch:
    """The body of POST /access/v1/evaluations: defaults at the top, `evaluations`,
    `options.evaluations_semantic`. Every evaluation is read before any is decided."""
    if not isinstance(doc, dict):
        raise AuthzenInputError(f"the body must be a JSON object, found {_kind(doc)}", "")
    semantic = _semantic(doc.get("options"))
    items = doc.get("evaluations")
    if items is None or items == []:
        return Batch((parse_evaluation(doc),), semantic, single=True)
    if not isinstance(items, list):
        raise AuthzenInputError(f"'evaluations' must be an array, found {_kind(items)}",
                                "/evaluations")
    if len(items) > MAX_EVALUATIONS:
        raise AuthzenInputError(f"{len(items)} evaluations in one request; at most "
                                f"{MAX_EVALUATIONS} are taken", "/evaluations", too_large=True)
    reader = _Reader()
    evaluations = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise AuthzenInputError(f"an evaluation must be a JSON object, found {_kind(item)}",
                                    pointer("evaluations", i))
        evaluations.append(reader.evaluation(item, doc, ("evaluations", i)))
    return Batch(tuple(evaluations), semantic)


def _semantic(options: Any) -> str:
    if options is None:
        return EXECUTE_ALL
    if not isinstance(options, dict):
        raise AuthzenInputError(f"'options' must be an object, found {_kind(options)}",
                                "/options")
    semantic = options.get("evaluations_semantic", EXECUTE_ALL)
    if semantic not in SEMANTICS:
        raise AuthzenInputError(f"unknown evaluations_semantic {_shown(semantic)}; one of "
                                f"{', '.join(SEMANTICS)}", "/options/evaluations_semantic")
    return str(semantic)


class _Reader:
    """Reads evaluations, each entity once: a batch's top-level defaults are read (and their
    category built) once for all the evaluations that use them."""

    def __init__(self) -> None:
        self._built: dict[tuple[int, str], tuple[CategoryInstance | None, str]] = {}

    def evaluation(self, item: dict[str, Any], defaults: dict[str, Any],
                   at: tuple[str | int, ...]) -> Evaluation:
        subject, subject_at = self._entity(item, defaults, "subject", at)
        resource, resource_at = self._entity(item, defaults, "resource", at)
        action, action_at = self._entity(item, defaults, "action", at)
        subject_id = self._cached(subject, subject_at, "subject", _subject)[1]
        instances = [self._cached(resource, resource_at, "resource", _resource)[0],
                     self._cached(action, action_at, "action", _action)[0]]
        context, context_at = self._entity(item, defaults, "context", at, required=False)
        if context is not None:
            environment = self._cached(context, context_at, "context", _context)[0]
            if environment is not None:
                instances.append(environment)
        return Evaluation(subject_id, subject_at + "/id",
                          RequestContext([i for i in instances if i is not None]))

    def _entity(self, item: dict[str, Any], defaults: dict[str, Any], key: str,
                at: tuple[str | int, ...], required: bool = True) -> tuple[Any, str]:
        """The entity `key` of the evaluation, else the batch's default; and its pointer."""
        if item.get(key) is not None:
            return item[key], pointer(*at, key)
        if item is not defaults and defaults.get(key) is not None:
            return defaults[key], pointer(key)
        if required:
            where = pointer(*at, key)
            also = " (nor a default at the top of the request)" if item is not defaults else ""
            raise AuthzenInputError(f"'{key}' is required{also}", where)
        return None, pointer(*at, key)

    def _cached(self, entity: Any, at: str, kind: str,
                read: Callable[[Any, str], tuple[CategoryInstance | None, str]]
                ) -> tuple[CategoryInstance | None, str]:
        key = (id(entity), kind)
        found = self._built.get(key)
        if found is None:
            found = read(entity, at)
            self._built[key] = found  # the document outlives the reader: ids stay unique
        return found


def _object(entity: Any, at: str, what: str) -> dict[str, Any]:
    if not isinstance(entity, dict):
        raise AuthzenInputError(f"'{what}' must be an object, found {_kind(entity)}", at)
    return entity


def _string(entity: dict[str, Any], key: str, at: str, what: str) -> str:
    value = entity.get(key)
    if value is None:
        raise AuthzenInputError(f"'{what}.{key}' is required", f"{at}/{key}")
    if not isinstance(value, str):
        raise AuthzenInputError(f"'{what}.{key}' must be a string, found {_kind(value)}",
                                f"{at}/{key}")
    _check_text(value, f"{at}/{key}")
    return value


def _subject(entity: Any, at: str) -> tuple[CategoryInstance | None, str]:
    subject = _object(entity, at, "subject")
    subject_id = _string(subject, "id", at, "subject")
    _string(subject, "type", at, "subject")
    _attributes(subject.get("properties"), f"{at}/properties", "subject.properties")
    return None, subject_id


def _resource(entity: Any, at: str) -> tuple[CategoryInstance | None, str]:
    resource = _object(entity, at, "resource")
    attributes = [RequestAttribute(RESOURCE_ID, STRING, (_string(resource, "id", at, "resource"),)),
                  RequestAttribute(RESOURCE_TYPE, STRING,
                                   (_string(resource, "type", at, "resource"),))]
    attributes += _attributes(resource.get("properties"), f"{at}/properties",
                              "resource.properties", reserved={
                                  RESOURCE_ID: "resource.id", RESOURCE_TYPE: "resource.type"})
    return CategoryInstance.build(RESOURCE, attributes), ""


def _action(entity: Any, at: str) -> tuple[CategoryInstance | None, str]:
    action = _object(entity, at, "action")
    attributes = [RequestAttribute(ACTION_ID, STRING, (_string(action, "name", at, "action"),))]
    attributes += _attributes(action.get("properties"), f"{at}/properties", "action.properties",
                              reserved={ACTION_ID: "action.name"})
    return CategoryInstance.build(ACTION, attributes), ""


def _context(entity: Any, at: str) -> tuple[CategoryInstance | None, str]:
    attributes = _attributes(entity, at, "context")
    return (CategoryInstance.build(ENVIRONMENT, attributes) if attributes else None), ""


def _attributes(properties: Any, at: str, what: str,
                reserved: Mapping[str, str] | None = None) -> list[RequestAttribute]:
    """Attributes of a properties object (or the context), flattened (module docstring)."""
    if properties is None:
        return []
    if not isinstance(properties, dict):
        raise AuthzenInputError(f"'{what}' must be an object, found {_kind(properties)}", at)
    out: list[RequestAttribute] = []
    _flatten(properties, "", at, 1, out, reserved or {})
    return out


def _flatten(obj: dict[str, Any], prefix: str, at: str, depth: int,
             out: list[RequestAttribute], reserved: Mapping[str, str]) -> None:
    if depth > MAX_PROPERTY_DEPTH:
        raise AuthzenInputError(f"properties nest deeper than {MAX_PROPERTY_DEPTH} objects", at)
    for key, value in obj.items():
        where = f"{at}/{pointer(key)[1:]}"
        if not key or len(key) > MAX_KEY_LENGTH:
            raise AuthzenInputError(f"a property name must have 1 to {MAX_KEY_LENGTH} "
                                    "characters", where)
        _check_text(key, where)
        attribute_id = prefix + key
        if attribute_id in reserved:
            raise AuthzenInputError(f"{attribute_id!r} is given by '{reserved[attribute_id]}', "
                                    "not by a property", where)
        if attribute_id.startswith(GATEWAY_PREFIX):
            raise AuthzenInputError(f"{GATEWAY_PREFIX} attributes are the gateway's to say "
                                    "(its environment, the stream a request is joined with), "
                                    "not a request's", where)
        if isinstance(value, dict):
            _flatten(value, attribute_id + ".", where, depth + 1, out, reserved)
            continue
        attribute = _attribute(attribute_id, value, where)
        if attribute is not None:
            if len(out) >= MAX_ATTRIBUTES:
                raise AuthzenInputError(f"more than {MAX_ATTRIBUTES} attributes", where)
            out.append(attribute)


def _attribute(attribute_id: str, value: Any, at: str) -> RequestAttribute | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_VALUES:
        raise AuthzenInputError(f"more than {MAX_VALUES} values in one array", at)
    lexicals: list[str] = []
    types: set[str] = set()
    for i, item in enumerate(items):
        where = f"{at}/{i}" if isinstance(value, list) else at
        lexical, datatype = _lexical(item, where)
        lexicals.append(lexical)
        types.add(datatype)
    if not lexicals:
        return None
    if types == {_INTEGER, _DOUBLE}:
        lexicals = [repr(float(v)) for v in lexicals]
        types = {_DOUBLE}
    if len(types) > 1:
        raise AuthzenInputError("the values of one array must all be strings, all numbers or "
                                "all booleans", at)
    return RequestAttribute(attribute_id, types.pop(), tuple(lexicals))


def _lexical(value: Any, at: str) -> tuple[str, str]:
    if isinstance(value, bool):
        return ("true" if value else "false"), _BOOLEAN
    if isinstance(value, int):
        return str(value), _INTEGER
    if isinstance(value, float):
        if not math.isfinite(value):
            raise AuthzenInputError("numbers must be finite", at)
        return repr(value), _DOUBLE
    if isinstance(value, str):
        _check_text(value, at)
        return value, STRING
    what = "an array in an array" if isinstance(value, list) else f"{_kind(value)} in an array"
    raise AuthzenInputError(f"{what} is not an attribute value (strings, numbers, booleans, "
                            "or arrays of them)", at)


def _check_text(text: str, at: str) -> None:
    bad = _NON_XML_CHARS.search(text)
    if bad:
        raise AuthzenInputError(f"the character U+{ord(bad.group()):04X} cannot be an attribute "
                                "value or name", at)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    return ascii(value)[:80] if isinstance(value, str) else _kind(value)


# ----------------------------------------------------------------------------- decisions


def run_batch(batch: Batch, decide: Callable[[Evaluation], Result]) -> list[Result]:
    """The results of a batch's evaluations, in order, as its semantic has it: every one
    (execute_all), up to and including the first not permitted (deny_on_first_deny), up to and
    including the first permitted (permit_on_first_permit)."""
    results = []
    for evaluation in batch.evaluations:
        result = decide(evaluation)
        results.append(result)
        permitted = result.decision is Decision.PERMIT
        if batch.semantic == DENY_ON_FIRST_DENY and not permitted:
            break
        if batch.semantic == PERMIT_ON_FIRST_PERMIT and permitted:
            break
    return results


_REASONS = {Decision.DENY: "denied by policy",
            Decision.NOT_APPLICABLE: "no policy applies to this request"}


def decision_json(result: Result) -> dict[str, Any]:
    """The AuthZEN Decision of a XACML result (module docstring)."""
    out: dict[str, Any] = {"decision": result.decision is Decision.PERMIT}
    context: dict[str, Any] = {}
    if result.decision is not Decision.PERMIT:
        context["reason"] = _reason(result)
        context["xacml_decision"] = result.decision.value
    status = result.status
    if status.code != STATUS_OK:
        shown: dict[str, Any] = {"code": status.code}
        if status.message:
            shown["message"] = status.message
        if status.missing_attributes:
            shown["missing_attributes"] = [
                _no_none({"category": m.category, "attribute_id": m.attribute_id,
                          "datatype": m.datatype, "issuer": m.issuer})
                for m in status.missing_attributes]
        context["status"] = shown
    if result.obligations:
        context["obligations"] = [_obligation_json(o) for o in result.obligations]
    if result.advice:
        context["advice"] = [_obligation_json(a) for a in result.advice]
    if context:
        out["context"] = context
    return out


def _reason(result: Result) -> str:
    reason = _REASONS.get(result.decision)
    if reason is not None:
        return reason
    status = result.status
    if status.code == STATUS_MISSING_ATTRIBUTE and status.missing_attributes:
        names = ", ".join(m.attribute_id for m in status.missing_attributes)
        return f"missing attribute: {names}"
    return "the decision could not be made: " + (status.message or status.code)


def _obligation_json(obligation: Obligation) -> dict[str, Any]:
    out: dict[str, Any] = {"id": obligation.id}
    if obligation.assignments:
        out["attribute_assignments"] = [
            _no_none({"attribute_id": a.attribute_id, "value": a.value, "datatype": a.datatype,
                      "category": a.category, "issuer": a.issuer})
            for a in obligation.assignments]
    return out


def _no_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def evaluations_json(results: Sequence[Result]) -> dict[str, Any]:
    """The Access Evaluations response of these results."""
    return {"evaluations": [decision_json(r) for r in results]}


__all__ = ["AuthzenInputError", "Batch", "DENY_ON_FIRST_DENY", "EXECUTE_ALL", "Evaluation",
           "MAX_EVALUATIONS", "PERMIT_ON_FIRST_PERMIT", "RESOURCE_TYPE", "SEMANTICS",
           "decision_json", "evaluations_json", "parse_evaluation", "parse_evaluations",
           "pointer", "run_batch"]
