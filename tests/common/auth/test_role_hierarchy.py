"""Role hierarchies (issue 47): a role that inherits another gets its grants; hierarchies from the
auth file and from a JWT claim; a cycle refused at load; a changed hierarchy announced exactly
for the subjects whose roles it widens differently (the gateway re-decides their handles: the
end-to-end case is tests/e2e/test_role_hierarchy.py)."""
from __future__ import annotations

import json
import logging

import pytest

from common.auth import AuthFileError, TokenAuthenticator, TokenFileAuthenticator, parse_auth_file
from common.oidc import CompositeAuthenticator, InvalidToken, JwtAuthenticator
from common.roles import RoleHierarchy, RoleHierarchyError
from pep.config import GatewayConfig
from pep.http.app import create_app
from pep.services import build_services
from tests.common.auth.test_identity_changes import Heard, entry, replace_file
from tests.common.auth.test_oidc import jwt_bearer, settings
from tests.pdp.api.conftest import JSON, XML, simple_policy

# the interop Todo scenario's roles: admin and evil_genius are editors, editors are viewers
TODO = {"admin": ["editor"], "evil_genius": ["editor"], "editor": ["viewer"]}
ROLE = "urn:oasis:names:tc:xacml:2.0:subject:role"


def test_expansion_is_transitive_ordered_and_deduplicated():
    h = RoleHierarchy.parse(TODO, "test")
    assert h.expand(["admin"]) == ("admin", "editor", "viewer")
    assert h.expand(["viewer", "evil_genius", "admin"]) == (
        "viewer", "evil_genius", "admin", "editor")
    assert h.expand(["guest"]) == ("guest",) and RoleHierarchy().expand(["a", "a"]) == ("a",)
    # one junior may be written as a string; the same hierarchy said twice is equal
    assert RoleHierarchy.parse({"editor": "viewer", "admin": ["editor", "editor"],
                                "evil_genius": ["editor"]}, "x") == h
    assert h.union(RoleHierarchy.parse({"viewer": ["guest"]}, "y")).expand(["admin"]) == (
        "admin", "editor", "viewer", "guest")


@pytest.mark.parametrize("data, needle", [
    ({"a": ["b"], "b": ["c"], "c": ["a"]}, "roles inherit each other in a cycle: a -> b -> c -> a"),
    ({"root": ["a"], "a": ["a"]}, "cycle: a -> a"),
    (["a"], "must be an object of role -> list"),
    ({"a": 5}, "'a': must be a list of the roles it inherits"),
    ({"a": ["", "b"]}, "role names must be non-empty strings"),
    ({"": ["b"]}, "role names must be non-empty strings"),
])
def test_bad_hierarchies_are_refused_saying_what(data, needle):
    with pytest.raises(RoleHierarchyError) as info:
        RoleHierarchy.parse(data, "auth.json: role_hierarchy")
    assert needle in str(info.value) and str(info.value).startswith("auth.json: role_hierarchy")


def test_a_long_chain_is_checked_without_exhausting_the_stack():
    chain = {f"r{i}": [f"r{i + 1}"] for i in range(5000)}
    assert len(RoleHierarchy.parse(chain, "x").expand(["r0"])) == 5001
    chain["r5000"] = ["r0"]
    with pytest.raises(RoleHierarchyError, match="cycle: r0 -> r1 -> r2"):
        RoleHierarchy.parse(chain, "x")


# -- the auth file ---------------------------------------------------------------------------------

def file_with(entries: list[dict], hierarchy: dict | None) -> dict | list:
    return entries if hierarchy is None else {"tokens": entries, "role_hierarchy": hierarchy}


TODO_USERS = [entry("tok-rick", "rick", ("admin", "evil_genius")), entry("tok-morty", "morty",
                                                                          ("editor",)),
              entry("tok-beth", "beth", ("viewer",)), entry("tok-jerry", "jerry", ("guest",))]


def test_the_object_form_widens_every_identity_and_the_list_form_stays(tmp_path):
    tokens = TokenAuthenticator(*parse_auth_file(file_with(TODO_USERS, TODO)))
    assert tokens.authenticate("tok-rick").roles == ("admin", "evil_genius", "editor", "viewer")
    assert tokens.identity_for("morty").roles == ("editor", "viewer")
    assert tokens.identity_for("beth").roles == ("viewer",)
    assert tokens.identity_for("rick").admin is False  # an inherited role makes nobody an admin
    plain = TokenAuthenticator(*parse_auth_file(TODO_USERS))
    assert plain.identity_for("rick").roles == ("admin", "evil_genius") and not plain.hierarchy


@pytest.mark.parametrize("data, needle", [
    ({"tokens": TODO_USERS, "role_hierarchy": {"viewer": ["admin"], **TODO}},
     "auth.json: role_hierarchy: roles inherit each other in a cycle: admin -> editor -> viewer "
     "-> admin"),
    ({"tokens": TODO_USERS, "roles": {}}, "unknown field(s) roles"),
    ({"role_hierarchy": TODO}, "an object with 'tokens' (that list) and 'role_hierarchy'; found "
                               "an object without 'tokens'"),
    ({"tokens": [{"token": "x"}], "role_hierarchy": TODO}, "auth.json: tokens: entry 0"),
])
def test_a_bad_file_is_refused_at_load_with_a_clear_error(tmp_path, data, needle):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AuthFileError) as info:
        TokenFileAuthenticator(path)
    assert needle.replace("auth.json", str(path)) in str(info.value), str(info.value)


def test_a_cycle_in_a_new_version_keeps_the_hierarchy_in_force(tmp_path, caplog):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(file_with(TODO_USERS, TODO)))
    tokens = TokenFileAuthenticator(path, check_interval=0)
    heard = Heard()
    tokens.add_listener(heard)
    with caplog.at_level(logging.ERROR, logger="common.auth"):
        replace_file(path, file_with(TODO_USERS, {**TODO, "viewer": ["evil_genius"]}))
        assert tokens.reload() is False
    assert "cycle: editor -> viewer -> evil_genius -> editor" in caplog.text
    assert tokens.identity_for("morty").roles == ("editor", "viewer") and heard.calls == []


def test_a_changed_hierarchy_announces_exactly_the_subjects_it_widens_differently(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(file_with(TODO_USERS, TODO)))
    tokens = TokenFileAuthenticator(path, check_interval=0)
    heard, hierarchies = Heard(), []
    tokens.add_listener(heard)
    tokens.add_hierarchy_listener(lambda old, new: hierarchies.append((old, new)))
    # editors no longer view: rick (admin, evil_genius) and morty (editor) lose viewer; beth
    # (viewer) and jerry (guest) keep what they had
    replace_file(path, file_with(TODO_USERS, {"admin": ["editor"], "evil_genius": ["editor"]}))
    assert tokens.reload() is True
    assert heard.calls == [(frozenset({"rick", "morty"}), "auth file")]
    assert tokens.identity_for("morty").roles == ("editor",)
    assert [new.as_json() for _, new in hierarchies] == [
        {"admin": ["editor"], "evil_genius": ["editor"]}]
    # the list form again: the hierarchy is gone, and only rick changes (he loses editor)
    replace_file(path, TODO_USERS)
    assert tokens.reload() is True
    assert heard.calls[-1] == (frozenset({"rick"}), "auth file") and not tokens.hierarchy


# -- OIDC claims -----------------------------------------------------------------------------------

def oidc(issuer, **overrides):
    return settings(issuer, role_hierarchy_claim="authz.role_hierarchy", **overrides)


def test_a_token_carrying_a_hierarchy_widens_its_roles(issuer):
    auth = JwtAuthenticator(oidc(issuer, admin_role="admin"))
    identity = auth.authenticate(issuer.token("summer", roles=["evil_genius"],
                                              authz={"role_hierarchy": TODO}))
    assert identity.roles == ("consumer", "evil_genius", "editor", "viewer")
    assert identity.admin is False
    assert auth.identity_for("summer") == identity
    # the claim is read only when configured
    plain = JwtAuthenticator(settings(issuer))
    assert plain.authenticate(issuer.token("summer", roles=["evil_genius"],
                                           authz={"role_hierarchy": TODO})).roles == (
        "consumer", "evil_genius")
    # the admin role is never inherited: a token whose hierarchy makes its role an admin's
    boss = auth.authenticate(issuer.token("boss", roles=["boss"],
                                          authz={"role_hierarchy": {"boss": ["admin"]}}))
    assert "admin" in boss.roles and boss.admin is False


@pytest.mark.parametrize("hierarchy, needle", [
    ({"a": ["b"], "b": ["a"]}, "token claim 'authz.role_hierarchy': roles inherit each other in "
                               "a cycle: a -> b -> a"),
    (["a"], "token claim 'authz.role_hierarchy': must be an object"),
])
def test_a_token_with_a_bad_hierarchy_is_refused(issuer, hierarchy, needle):
    auth = JwtAuthenticator(oidc(issuer))
    with pytest.raises(InvalidToken) as info:
        auth.authenticate(issuer.token("x", authz={"role_hierarchy": hierarchy}))
    assert needle in info.value.message


def test_the_auth_files_hierarchy_widens_jwt_identities_and_its_changes_are_announced(
        issuer, tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(file_with(TODO_USERS, {"editor": ["viewer"]})))
    tokens = TokenFileAuthenticator(path, check_interval=0)
    jwt = JwtAuthenticator(oidc(issuer), remember_file=tmp_path / "ids.json")
    composite = CompositeAuthenticator(tokens, jwt)
    heard = Heard()
    composite.add_listener(heard)
    # the token says admin inherits editor; the file says editor inherits viewer: both count
    summer = composite.authenticate(issuer.token(
        "summer", roles=["admin"], authz={"role_hierarchy": {"admin": ["editor"]}}))
    assert summer.roles == ("consumer", "admin", "editor", "viewer")
    jerry = composite.authenticate(issuer.token("jerry-jwt", roles=["guest"]))
    assert jerry.roles == ("consumer", "guest")
    # a cycle between the token's hierarchy and the file's refuses the token
    with pytest.raises(InvalidToken, match="with the auth file's role_hierarchy: roles inherit"):
        composite.authenticate(issuer.token("x", authz={"role_hierarchy": {"viewer": ["editor"]}}))
    # the file's hierarchy changes: summer (a JWT subject) and morty (a file subject) are
    # announced, jerry's roles are the same and he is not
    replace_file(path, file_with(TODO_USERS, {}))
    assert tokens.reload() is True
    assert (frozenset({"summer"}), "role hierarchy (auth file)") in heard.calls
    assert (frozenset({"morty"}), "auth file") in heard.calls
    assert not any("jerry-jwt" in subjects for subjects, _ in heard.calls)
    assert composite.identity_for("summer").roles == ("consumer", "admin", "editor")
    # the token's own hierarchy is remembered across a restart (no token kept)
    again = JwtAuthenticator(oidc(issuer), remember_file=tmp_path / "ids.json")
    assert again.identity_for("summer").roles == ("consumer", "admin", "editor")
    assert "eyJ" not in (tmp_path / "ids.json").read_text()


# -- decisions: a grant through an inherited role --------------------------------------------------

def role_policy(policy_id: str, role: str, resource: str = "todos") -> bytes:
    """Permit anyone holding `role` on `resource` (the role bag, as the RBAC profile has it)."""
    return simple_policy(policy_id, resource, role).replace(
        b"urn:oasis:names:tc:xacml:1.0:subject:subject-id", ROLE.encode())


@pytest.fixture
def gateway(issuer, tmp_path):
    auth_file = tmp_path / "auth.json"
    admin = {"token": "tok-admin-0123456789", "subject": "root", "roles": [], "admin": True}
    auth_file.write_text(json.dumps(file_with(TODO_USERS + [admin], TODO)))
    config = GatewayConfig(data_dir=tmp_path / "data", auth_file=auth_file, policies_dir=None,
                           port=0, oidc=oidc(issuer))
    services = build_services(config)
    client = create_app(services=services).test_client()
    r = client.post("/policies", data=role_policy("urn:test:viewers", "viewer"),
                    headers={"Authorization": "Bearer tok-admin-0123456789", "Content-Type": XML})
    assert r.status_code == 201, r.get_json()
    try:
        yield client, services, auth_file
    finally:
        services.close()


def decision(client, authorization: dict) -> str:
    body = json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:"
                                                   "resource-id", "Value": "todos"}]},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}})
    r = client.post("/pdp", data=body, headers={**authorization, "Content-Type": JSON})
    assert r.status_code == 200, r.data
    return r.get_json()["Response"][0]["Decision"]


def test_a_grant_to_a_role_reaches_the_roles_that_inherit_it(gateway, issuer):
    client, services, auth_file = gateway

    def as_(token: str) -> str:
        return decision(client, {"Authorization": f"Bearer {token}"})

    # the policy names only `viewer`: beth holds it, morty and rick inherit it, jerry does not
    assert [as_(t) for t in ("tok-beth", "tok-morty", "tok-rick", "tok-jerry")] == [
        "Permit", "Permit", "Permit", "NotApplicable"]
    # a JWT caller: through the token's claim, and through the file's hierarchy alone
    assert decision(client, jwt_bearer(issuer.token(
        "summer", roles=["intern"], authz={"role_hierarchy": {"intern": ["viewer"]}}))) == "Permit"
    assert decision(client, jwt_bearer(issuer.token("squanchy", roles=["editor"]))) == "Permit"
    assert decision(client, jwt_bearer(issuer.token("birdperson", roles=["intern"]))) == \
        "NotApplicable"
    # the inheritance removed from the file: the next decision is made without it
    auth_file.write_text(json.dumps(file_with(TODO_USERS, {"admin": ["editor"]})))
    assert services.authenticator.reload() is True
    assert [as_(t) for t in ("tok-beth", "tok-morty", "tok-rick")] == [
        "Permit", "NotApplicable", "NotApplicable"]
    assert decision(client, jwt_bearer(issuer.token("squanchy", roles=["editor"]))) == \
        "NotApplicable"
