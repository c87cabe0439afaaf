"""AuthZEN Authorization API 1.0 (issue 47) over the gateway's PDP, through Flask's test client:
allow, deny, a missing attribute, batches with each evaluation semantic, a spoofed subject,
malformed and hostile bodies, the discovery document, and the shapes of the specification's
examples and of the interop "Todo" scenario (our own cases, written from the specification).

Every AuthZEN answer is checked against POST /pdp's for the same caller and request where it
matters: AuthZEN must say what /pdp says, never more."""
from __future__ import annotations

import json
import random

import pytest

from common.auth import write_auth_file
from pdp.authzen import RESOURCE_TYPE
from pep.http.app import create_app
from pep.services import build_services
from tests.pdp.api.conftest import AUTH_ENTRIES, JSON, XML, bearer, make_config

EVALUATION = "/access/v1/evaluation"
EVALUATIONS = "/access/v1/evaluations"
PERMIT_OBLIGATIONS = ["exacml:obligation:stream-filter", "exacml:obligation:stream-map",
                      "exacml:obligation:stream-window"]
XS = "http://www.w3.org/2001/XMLSchema#"
MISSING = "urn:oasis:names:tc:xacml:1.0:status:missing-attribute"
SITE = "urn:example:site"

# -- policies of our own: a book loan (nested properties, an action property, a context
# attribute that must be present) and the interop Todo scenario (roles, owners)


def _designator(category: str, attribute_id: str, must: bool = False,
                datatype: str = "string") -> str:
    return (f'<AttributeDesignator Category="{category}" AttributeId="{attribute_id}" '
            f'DataType="{XS}{datatype}" MustBePresent="{str(must).lower()}"/>')


RES = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ACT = "urn:oasis:names:tc:xacml:3.0:attribute-category:action"
ENV = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
SUBJ = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
FN = "urn:oasis:names:tc:xacml:1.0:function:"
ACTION_ID = "urn:oasis:names:tc:xacml:1.0:action:action-id"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
SUBJECT_ID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
ROLE = "urn:oasis:names:tc:xacml:2.0:subject:role"


def _is_in(value: str, category: str, attribute_id: str, must: bool = False) -> str:
    return (f'<Apply FunctionId="{FN}string-is-in"><AttributeValue DataType="{XS}string">'
            f'{value}</AttributeValue>{_designator(category, attribute_id, must)}</Apply>')


def _target_type(resource_type: str) -> str:
    return (f'<Target><AnyOf><AllOf><Match MatchId="{FN}string-equal"><AttributeValue '
            f'DataType="{XS}string">{resource_type}</AttributeValue>'
            f'{_designator(RES, RESOURCE_TYPE)}</Match></AllOf></AnyOf></Target>')


def _policy(policy_id: str, target: str, rules: str) -> bytes:
    return (f'<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" '
            f'PolicyId="{policy_id}" Version="1.0" RuleCombiningAlgId="urn:oasis:names:tc:'
            f'xacml:3.0:rule-combining-algorithm:permit-overrides">{target}{rules}'
            f'</Policy>').encode()


def _rule(rule_id: str, condition: str, effect: str = "Permit", advice: str = "") -> str:
    return (f'<Rule RuleId="{rule_id}" Effect="{effect}"><Condition>{condition}</Condition>'
            f'{advice}</Rule>')


def _and(*parts: str) -> str:
    return f'<Apply FunctionId="{FN}and">{"".join(parts)}</Apply>'


def _or(*parts: str) -> str:
    return f'<Apply FunctionId="{FN}or">{"".join(parts)}</Apply>'


BOOK_POLICY = _policy("urn:test:authzen:books", _target_type("book"), _rule(
    "extend", _and(_is_in("extend-loan", ACT, ACTION_ID), _is_in("2W", ACT, "period"),
                   _is_in("978-0593383322", RES, "library_record.isbn"),
                   _is_in("north", ENV, SITE, must=True)),
    advice='<AdviceExpressions><AdviceExpression AdviceId="urn:test:advice:return-on-time" '
           'AppliesTo="Permit"><AttributeAssignmentExpression AttributeId="urn:test:days">'
           f'<AttributeValue DataType="{XS}integer">14</AttributeValue>'
           '</AttributeAssignmentExpression></AdviceExpression></AdviceExpressions>'))

_NOW = _designator(ENV, "urn:oasis:names:tc:xacml:1.0:environment:current-dateTime",
                  datatype="dateTime")
_TRUE = f'<AttributeValue DataType="{XS}boolean">true</AttributeValue>'
CLOCK_POLICY = _policy("urn:test:authzen:clock", _target_type("capsule"), "".join([
    _rule("before-1990", f'<Apply FunctionId="{FN}dateTime-less-than"><Apply FunctionId="{FN}'
                         f'dateTime-one-and-only">{_NOW}</Apply>'
                         f'<AttributeValue DataType="{XS}dateTime">1990-01-01T00:00:00Z'
                         f'</AttributeValue></Apply>'),
    _rule("gateway-storm", f'<Apply FunctionId="{FN}boolean-is-in">{_TRUE}'
                           f'{_designator(ENV, "urn:xsg:event:storm", datatype="boolean")}'
                           '</Apply>'),
    _rule("example-storm", f'<Apply FunctionId="{FN}boolean-is-in">{_TRUE}'
                           f'{_designator(ENV, "urn:example:storm", datatype="boolean")}'
                           '</Apply>'),
]))

_OWNER = (f'<Apply FunctionId="{FN}string-at-least-one-member-of">'
          f'{_designator(RES, "ownerID")}{_designator(SUBJ, SUBJECT_ID)}</Apply>')
TODO_POLICY = _policy("urn:test:authzen:todo", _target_type("todo"), "".join([
    _rule("read", _or(_is_in("can_read_user", ACT, ACTION_ID),
                      _is_in("can_read_todos", ACT, ACTION_ID))),
    _rule("create", _and(_is_in("can_create_todo", ACT, ACTION_ID), _is_in("editor", SUBJ, ROLE))),
    _rule("update", _and(_is_in("can_update_todo", ACT, ACTION_ID), _or(
        _is_in("evil_genius", SUBJ, ROLE), _and(_is_in("editor", SUBJ, ROLE), _OWNER)))),
    _rule("delete", _and(_is_in("can_delete_todo", ACT, ACTION_ID), _or(
        _is_in("admin", SUBJ, ROLE), _and(_is_in("editor", SUBJ, ROLE), _OWNER)))),
]))

# The Todo scenario's users and roles (subjects are their e-mail addresses here); its role
# hierarchy: admin and evil_genius are editors, editors are viewers
USERS = {"rick@the-citadel.com": ("admin", "evil_genius"), "morty@the-citadel.com": ("editor",),
         "summer@the-smiths.com": ("editor",), "beth@the-smiths.com": ("viewer",),
         "jerry@the-smiths.com": ("viewer",)}
TODO_HIERARCHY = {"admin": ["editor"], "evil_genius": ["editor"], "editor": ["viewer"]}


def todo_token(user: str) -> str:
    return "tok-todo-" + user.split("@")[0] + "-0123456789"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("authzen")
    entries = AUTH_ENTRIES + [{"token": todo_token(u), "subject": u, "roles": list(roles)}
                              for u, roles in USERS.items()]
    write_auth_file(tmp / "auth.json", {"tokens": entries, "role_hierarchy": TODO_HIERARCHY})
    services = build_services(make_config(tmp, base_url="https://pdp.example.com/"))
    app = create_app(services=services)
    app.testing = True
    client = app.test_client()
    for policy in (BOOK_POLICY, TODO_POLICY, CLOCK_POLICY):
        r = client.post("/policies", data=policy, headers={**bearer("nea"), "Content-Type": XML})
        assert r.status_code == 201, r.get_json()
    yield client, services
    services.close()


def post(client, path: str, body, who: str = "lta", token: str | None = None, **headers):
    auth = {"Authorization": f"Bearer {token}"} if token else bearer(who)
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(path, data=data, headers={"Content-Type": "application/json", **auth,
                                                  **headers})


def evaluation(subject: str, resource: str, action: str = "read", resource_type: str = "stream",
               **extra) -> dict:
    return {"subject": {"type": "user", "id": subject},
            "resource": {"type": resource_type, "id": resource}, "action": {"name": action},
            **extra}


def pdp_result(client, who: str, resource: str, action: str = "read") -> dict:
    """POST /pdp's answer to the same question (the subject bound from the token)."""
    body = {"Request": {
        "Resource": {"Attribute": [{"AttributeId": RESOURCE_ID, "Value": resource},
                                   {"AttributeId": RESOURCE_TYPE, "Value": "stream"}]},
        "Action": {"Attribute": [{"AttributeId": ACTION_ID, "Value": action}]}}}
    r = client.post("/pdp", data=json.dumps(body), headers={**bearer(who), "Content-Type": JSON})
    assert r.status_code == 200
    return r.get_json()["Response"][0]


# -- allow, deny, not applicable, a missing attribute ----------------------------------------------

def test_allow_carries_the_obligations_pdp_gives(gateway):
    client, _ = gateway
    r = post(client, EVALUATION, evaluation("lta", "weather"))
    assert r.status_code == 200 and r.mimetype == "application/json"
    answer = r.get_json()
    assert answer["decision"] is True
    obligations = answer["context"]["obligations"]
    assert [o["id"] for o in obligations] == PERMIT_OBLIGATIONS
    assert "reason" not in answer["context"] and "xacml_decision" not in answer["context"]
    # exactly POST /pdp's obligations, assignment by assignment
    xacml = pdp_result(client, "lta", "weather")
    assert xacml["Decision"] == "Permit"
    assert [[(a["AttributeId"], a["Value"], a["DataType"]) for a in o["AttributeAssignment"]]
            for o in xacml["Obligations"]] == [
        [(a["attribute_id"], a["value"], a["datatype"]) for a in o["attribute_assignments"]]
        for o in obligations]
    assert obligations[0]["attribute_assignments"][0]["value"] == "rainrate > 5"
    # the owner: the raw stream, a bare decision
    assert post(client, EVALUATION, evaluation("nea", "weather"), "nea").get_json() == {
        "decision": True}


def test_deny_and_not_applicable_are_false_with_a_reason(gateway):
    client, _ = gateway
    deny = post(client, EVALUATION, evaluation("other", "weather"), "other").get_json()
    assert deny == {"decision": False, "context": {"reason": "denied by policy",
                                                   "xacml_decision": "Deny"}}
    assert pdp_result(client, "other", "weather")["Decision"] == "Deny"
    na = post(client, EVALUATION, evaluation("lta", "no-such-stream")).get_json()
    assert na == {"decision": False, "context": {"reason": "no policy applies to this request",
                                                 "xacml_decision": "NotApplicable"}}


def test_a_missing_attribute_is_false_with_what_is_missing(gateway):
    client, _ = gateway
    book = {"type": "book", "id": "123", "properties": {
        "library_record": {"title": "AuthZEN in Action", "isbn": "978-0593383322"}}}
    ask = {"subject": {"type": "user", "id": "lta"}, "resource": book,
           "action": {"name": "extend-loan", "properties": {"period": "2W"}}}
    answer = post(client, EVALUATION, ask).get_json()
    assert answer["decision"] is False
    context = answer["context"]
    assert context["xacml_decision"] == "Indeterminate"
    assert context["reason"] == f"missing attribute: {SITE}"
    assert context["status"]["code"] == MISSING
    assert context["status"]["missing_attributes"] == [
        {"category": ENV, "attribute_id": SITE, "datatype": XS + "string"}]
    # given in the context: permitted, with the policy's advice; the nested property and the
    # action's property reached the decision (another isbn or period: not applicable)
    answer = post(client, EVALUATION, {**ask, "context": {SITE: "north"}}).get_json()
    assert answer == {"decision": True, "context": {"advice": [
        {"id": "urn:test:advice:return-on-time", "attribute_assignments": [
            {"attribute_id": "urn:test:days", "value": "14", "datatype": XS + "integer"}]}]}}
    other_isbn = json.loads(json.dumps(ask))
    other_isbn["resource"]["properties"]["library_record"]["isbn"] = "0"
    other_period = json.loads(json.dumps(ask))
    other_period["action"]["properties"]["period"] = "3W"
    for body in (other_isbn, other_period):
        assert post(client, EVALUATION, {**body, "context": {SITE: "north"}}).get_json()[
            "decision"] is False


def test_the_gateways_clock_and_environment_are_not_the_callers(gateway):
    """The context cannot claim the gateway's own attributes (as on POST /pdp): a policy
    permitting before 1990, or while the gateway's storm event holds, is not fooled."""
    client, _ = gateway

    def ask(context: dict) -> bool:
        body = evaluation("lta", "1", "open", "capsule", context=context)
        return post(client, EVALUATION, body).get_json()["decision"]

    assert ask({"urn:oasis:names:tc:xacml:1.0:environment:current-dateTime":
                "1985-10-26T01:22:00Z"}) is False
    assert ask({"urn:example:storm": True}) is True  # the caller's own context does count
    assert ask({"urn:example:storm": False}) is False
    # the gateway's own attributes are refused, in the context and in properties alike
    for where, body in (("/context", evaluation("lta", "1", "open", "capsule",
                                                context={"urn:xsg:event:storm": True})),
                        ("/resource/properties", _with("/resource/properties", {
                            "urn:xsg:resource:join-with": "ships"}))):
        r = post(client, EVALUATION, body)
        assert r.status_code == 400 and r.get_json()["field"].startswith(where + "/urn:xsg:")
        assert "the gateway's to say" in r.get_json()["error"]


# -- batches ---------------------------------------------------------------------------------------

def mixed_batch(n: int = 100, seed: int = 47) -> tuple[list[dict], list[bool]]:
    """n evaluations of lta (permit, not applicable, a missing attribute, a deny by condition)."""
    book = {"type": "book", "id": "123", "properties": {
        "library_record": {"isbn": "978-0593383322"}}}
    kinds = [
        ({"resource": {"type": "stream", "id": "weather"}}, True),
        ({"resource": {"type": "stream", "id": "unknown"}}, False),
        ({"resource": book, "action": {"name": "extend-loan", "properties": {"period": "2W"}}},
         False),  # no site: Indeterminate
        ({"resource": book, "action": {"name": "extend-loan", "properties": {"period": "2W"}},
          "context": {SITE: "north"}}, True),
        ({"resource": book, "action": {"name": "extend-loan", "properties": {"period": "1W"}},
          "context": {SITE: "north"}}, False),
    ]
    rng = random.Random(seed)
    chosen = [kinds[i % len(kinds)] for i in range(n)]
    rng.shuffle(chosen)
    return [dict(e) for e, _ in chosen], [want for _, want in chosen]


def test_a_batch_of_100_mixed_evaluations_under_each_semantic(gateway):
    client, _ = gateway
    items, wanted = mixed_batch()
    base = {"subject": {"type": "user", "id": "lta"}, "action": {"name": "read"},
            "evaluations": items}
    singles = [post(client, EVALUATION, {**base, **item}).get_json() for item in items]
    assert [s["decision"] for s in singles] == wanted
    default = post(client, EVALUATIONS, base)
    assert default.status_code == 200
    assert default.get_json() == {"evaluations": singles}  # in order, each as asked alone
    explicit = post(client, EVALUATIONS, {**base, "options": {
        "evaluations_semantic": "execute_all", "another_option": "ignored"}}).get_json()
    assert explicit == {"evaluations": singles}
    first_deny = wanted.index(False)
    answer = post(client, EVALUATIONS, {**base, "options": {
        "evaluations_semantic": "deny_on_first_deny"}}).get_json()["evaluations"]
    assert answer == singles[:first_deny + 1] and answer[-1]["decision"] is False
    permits_first = [{"resource": {"type": "stream", "id": "unknown"}}] * 3 + items
    answer = post(client, EVALUATIONS, {**base, "evaluations": permits_first, "options": {
        "evaluations_semantic": "permit_on_first_permit"}}).get_json()["evaluations"]
    assert len(answer) == 3 + wanted.index(True) + 1 and answer[-1]["decision"] is True
    assert not any(a["decision"] for a in answer[:-1])


def test_the_specifications_batch_examples(gateway):
    """The spec's examples: defaults at the top, an evaluation overriding one; three semantics
    over three documents; an evaluations request without evaluations is one evaluation."""
    client, _ = gateway
    body = {"subject": {"type": "user", "id": "morty@the-citadel.com"},
            "context": {"time": "2024-05-31T15:22-07:00"}, "action": {"name": "can_read_todos"},
            "evaluations": [{"resource": {"type": "todo", "id": "boxcarring.md"}},
                            {"resource": {"type": "todo", "id": "subject-search.md"}},
                            {"action": {"name": "can_delete_todo"},
                             "resource": {"type": "todo", "id": "resource-search.md",
                                          "properties": {"ownerID": "rick@the-citadel.com"}}}]}
    morty = todo_token("morty@the-citadel.com")
    r = post(client, EVALUATIONS, body, token=morty, **{"X-Request-ID": "bfe9eb29-ab87"})
    assert r.status_code == 200 and r.headers["X-Request-ID"] == "bfe9eb29-ab87"
    assert [e["decision"] for e in r.get_json()["evaluations"]] == [True, True, False]
    # no evaluations (or an empty array): the single Access Evaluation's answer
    single = {k: v for k, v in body.items() if k != "evaluations"} | {
        "resource": {"type": "todo", "id": "1"}}
    for extra in ({}, {"evaluations": []}):
        assert post(client, EVALUATIONS, {**single, **extra}, token=morty).get_json() == {
            "decision": True}
    # every evaluation may bring all four keys, with no defaults at all
    full = {"evaluations": [dict(single, action={"name": n}) for n in (
        "can_read_user", "can_create_todo", "can_delete_todo")]}
    assert [e["decision"] for e in post(client, EVALUATIONS, full, token=morty).get_json()[
        "evaluations"]] == [True, True, False]


@pytest.mark.parametrize("user, action, owner, want", [
    (user, action, owner, want)
    for user, roles in USERS.items()
    for action, owner, want in (
        ("can_read_user", None, True), ("can_read_todos", None, True),
        ("can_create_todo", None, bool({"admin", "editor", "evil_genius"} & set(roles))),
        ("can_update_todo", "own", bool({"admin", "editor", "evil_genius"} & set(roles))),
        ("can_update_todo", "other", "evil_genius" in roles),
        ("can_delete_todo", "own", bool({"admin", "editor", "evil_genius"} & set(roles))),
        ("can_delete_todo", "other", "admin" in roles))])
def test_the_interop_todo_scenario(gateway, user, action, owner, want):
    """The Todo scenario's decisions, with its roles as a hierarchy in the auth file."""
    client, _ = gateway
    properties = {} if owner is None else {
        "ownerID": user if owner == "own" else "somebody@else.com"}
    body = {"subject": {"type": "user", "id": user},
            "action": {"name": action},
            "resource": {"type": "todo", "id": "todo-1", "properties": properties},
            "context": {}}
    r = post(client, EVALUATION, body, token=todo_token(user))
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["decision"] is want, r.get_json()


# -- the subject is who authenticated -------------------------------------------------------------

def test_a_spoofed_subject_is_refused_saying_where(gateway):
    client, _ = gateway
    r = post(client, EVALUATION, evaluation("nea", "weather"), "lta")
    assert r.status_code == 403 and r.mimetype == "application/problem+json"
    assert r.get_json()["field"] == "/subject/id"
    assert "'nea'" in r.get_json()["error"] and "'lta'" in r.get_json()["error"]
    # an administrator does not evaluate for others either (as on POST /pdp)
    r = post(client, EVALUATION, evaluation("lta", "weather"), "nea")
    assert r.status_code == 403
    # in a batch: the evaluation that names another, or the default it inherits; nothing of
    # the batch is answered
    items = [{"resource": {"type": "stream", "id": "weather"}}] * 100
    items[57] = {"subject": {"type": "user", "id": "nea"}, **items[57]}
    r = post(client, EVALUATIONS, {"subject": {"type": "user", "id": "lta"},
                                   "action": {"name": "read"}, "evaluations": items})
    assert r.status_code == 403 and r.get_json()["field"] == "/evaluations/57/subject/id"
    r = post(client, EVALUATIONS, {"subject": {"type": "user", "id": "nea"},
                                   "action": {"name": "read"},
                                   "evaluations": [{"resource": {"type": "s", "id": "weather"}}]})
    assert r.status_code == 403 and r.get_json()["field"] == "/subject/id"


def test_subject_properties_claim_nothing(gateway):
    """What a body says of its subject is not what the decision sees (the token's identity)."""
    client, _ = gateway
    claims = {"roles": ["data-owner"], ROLE: ["data-owner"], SUBJECT_ID: "nea", "admin": True}
    ask = evaluation("other", "weather")
    ask["subject"]["properties"] = claims
    assert post(client, EVALUATION, ask, "other").get_json()["decision"] is False
    beth = {"subject": {"type": "user", "id": "beth@the-smiths.com",
                        "properties": {"roles": ["admin"], ROLE: "admin"}},
            "action": {"name": "can_create_todo"}, "resource": {"type": "todo", "id": "1"}}
    assert post(client, EVALUATION, beth,
                token=todo_token("beth@the-smiths.com")).get_json()["decision"] is False


# -- malformed and hostile bodies ------------------------------------------------------------------

OK = evaluation("lta", "weather")


def _with(path: str, value) -> dict:
    body = json.loads(json.dumps(OK))
    keys = path.strip("/").split("/")
    node = body
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is _DROP:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return body


_DROP = object()
NESTED = {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}


@pytest.mark.parametrize("path, body, status, field, needle", [
    (EVALUATION, b"{not json", 400, "", "not a JSON document"),
    (EVALUATION, b"", 400, "", "not a JSON document"),
    (EVALUATION, [OK], 400, "", "must be a JSON object, found an array"),
    (EVALUATION, _with("/subject", _DROP), 400, "/subject", "'subject' is required"),
    (EVALUATION, _with("/subject", "lta"), 400, "/subject", "must be an object, found a string"),
    (EVALUATION, _with("/subject/type", _DROP), 400, "/subject/type", "'subject.type' is required"),
    (EVALUATION, _with("/resource/type", None), 400, "/resource/type", "required"),
    (EVALUATION, _with("/resource/id", 7), 400, "/resource/id", "must be a string, found a number"),
    (EVALUATION, _with("/action/name", ["read"]), 400, "/action/name", "found an array"),
    (EVALUATION, _with("/resource/properties", [1]), 400, "/resource/properties",
     "must be an object"),
    (EVALUATION, _with("/context", "now"), 400, "/context", "'context' must be an object"),
    (EVALUATION, _with("/resource/properties", {"tags": [{"a": 1}]}), 400,
     "/resource/properties/tags/0", "an object in an array"),
    (EVALUATION, _with("/resource/properties", {"m": [[1]]}), 400, "/resource/properties/m/0",
     "an array in an array"),
    (EVALUATION, _with("/action/properties", {"x": [1, "a"]}), 400, "/action/properties/x",
     "must all be strings, all numbers or all booleans"),
    (EVALUATION, _with("/resource/properties", NESTED), 400,
     "/resource/properties/a/b/c/d/e/f/g/h", "nest deeper than 8"),
    (EVALUATION, _with("/resource/properties", {"a/b~c": {"": 1}}), 400,
     "/resource/properties/a~1b~0c/", "1 to 512 characters"),
    (EVALUATION, _with("/resource/properties", {RESOURCE_ID: "weather"}), 400,
     f"/resource/properties/{RESOURCE_ID}", "given by 'resource.id'"),
    (EVALUATION, _with("/action/properties", {ACTION_ID: "write"}), 400,
     f"/action/properties/{ACTION_ID}", "given by 'action.name'"),
    (EVALUATION, _with("/resource/properties", {"n": list(range(1025))}), 400,
     "/resource/properties/n", "more than 1024 values"),
    (EVALUATION, _with("/context", {f"k{i}": i for i in range(257)}), 400, "/context/k256",
     "more than 256 attributes"),
    (EVALUATION, json.dumps(OK).replace('"weather"', '"\\ud800"'), 400, "/resource/id",
     "U+D800"),
    (EVALUATION, json.dumps(_with("/context", {"x": 1})).replace("1}", "NaN}"), 400, "/context/x",
     "finite"),
    (EVALUATION, "[" * 100_000 + "]" * 100_000, 400, "", "nests deeper than"),
    (EVALUATIONS, {"evaluations": {"resource": {}}}, 400, "/evaluations", "must be an array"),
    (EVALUATIONS, {**OK, "evaluations": [{}, {}, {}, 5]}, 400, "/evaluations/3",
     "must be a JSON object, found a number"),
    (EVALUATIONS, {"evaluations": [{"resource": OK["resource"], "action": OK["action"]}]}, 400,
     "/evaluations/0/subject", "nor a default at the top"),
    (EVALUATIONS, {**OK, "evaluations": [{}], "options": "all"}, 400, "/options",
     "must be an object"),
    (EVALUATIONS, {**OK, "evaluations": [{}], "options": {"evaluations_semantic": "any"}}, 400,
     "/options/evaluations_semantic", "unknown evaluations_semantic 'any'"),
    (EVALUATIONS, {**OK, "evaluations": [{}] * 1001}, 413, "/evaluations",
     "1001 evaluations in one request; at most 1000"),
])
def test_malformed_and_hostile_bodies_get_4xx_saying_what_and_where(gateway, path, body, status,
                                                                     field, needle):
    client, _ = gateway
    r = post(client, path, body, **{"X-Request-ID": "req-7"})
    assert r.status_code == status, (r.status_code, r.get_data()[:300])
    answer = r.get_json()
    assert r.mimetype == "application/problem+json" and answer["status"] == status
    assert answer["field"] == field and needle in answer["error"], answer
    assert r.headers["X-Request-ID"] == "req-7"


def test_http_level_refusals(gateway):
    client, services = gateway
    body = json.dumps(OK)
    r = client.post(EVALUATION, data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    r = client.post(EVALUATION, data=body, headers={**bearer("lta"), "Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.get_json()["error"]
    r = post(client, EVALUATION, OK, Accept="application/xml")
    assert r.status_code == 406
    assert post(client, EVALUATION, OK, Accept="*/*").status_code == 200
    r = post(client, EVALUATIONS, OK, **{"X-Request-ID": "x" * 300})
    assert r.status_code == 400 and r.get_json()["field"] == "header X-Request-ID"
    assert "X-Request-ID" not in r.headers
    limit = services.config.max_content_length
    big = {**OK, "context": {"blob": "x" * limit}}
    r = post(client, EVALUATION, big)
    assert r.status_code == 413
    assert client.get(EVALUATION, headers=bearer("lta")).status_code == 405


def test_decisions_wait_for_the_engine_the_metadata_does_not(gateway):
    client, services = gateway
    engine = services.policies._engine
    services.policies._engine = None
    try:
        assert post(client, EVALUATION, OK).status_code == 503
        assert client.get("/.well-known/authzen-configuration").status_code == 200
    finally:
        services.policies._engine = engine


# -- discovery -----------------------------------------------------------------------------------

def test_the_discovery_document_names_the_endpoints(gateway, tmp_path):
    client, _ = gateway
    r = client.get("/.well-known/authzen-configuration")  # no token: public metadata
    assert r.status_code == 200 and r.mimetype == "application/json"
    assert r.get_json() == {
        "policy_decision_point": "https://pdp.example.com",
        "access_evaluation_endpoint": "https://pdp.example.com/access/v1/evaluation",
        "access_evaluations_endpoint": "https://pdp.example.com/access/v1/evaluations"}
    assert "max-age" in r.headers["Cache-Control"]
    # without a configured base URL: the URL the request reached the gateway by
    services = build_services(make_config(tmp_path))
    try:
        app = create_app(services=services)
        doc = app.test_client().get("/.well-known/authzen-configuration",
                                    base_url="http://gw.internal:8080").get_json()
        assert doc["policy_decision_point"] == "http://gw.internal:8080"
        assert doc["access_evaluations_endpoint"] == \
            "http://gw.internal:8080/access/v1/evaluations"
        paths = app.test_client().get("/openapi.json").get_json()["paths"]
        assert {"/access/v1/evaluation", "/access/v1/evaluations",
                "/.well-known/authzen-configuration"} <= set(paths)
        assert paths["/access/v1/evaluations"]["post"]["requestBody"]["content"][
            "application/json"]["schema"]["$ref"].endswith("AuthzenEvaluations")
    finally:
        services.close()
