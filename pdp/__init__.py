"""xsg's XACML 3.0 PDP: what the rest of the gateway may use of it.

The engine stays flat in this package (parsing, datatypes, functions, evaluation, combining,
index); the stream side and the wiring import only the names below. They come in two parts:

- the decision surface, imported eagerly: engine, requests, responses, results, identities,
  policy management rules, policy events and policy scope. It is pure Python (no Flask, no
  SQLite), so the PEP's pure core can import it and stay pure;
- the persistence surface (the policy store, on SQLite or PostgreSQL, and the policy service
  over it), imported on first use through `__getattr__` (PEP 562), so that importing `pdp` never
  loads sqlite3 (or psycopg) for a caller that only decides.

The HTTP face (`pdp.http`: the /pdp and /policies blueprint, request authentication, the error
body) is imported from there by the HTTP edge only.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from pdp.auth import AuthFileError, Identity, TokenAuthenticator, new_token, write_auth_file
from pdp.engine import (PolicyEngine, PolicyInfo, PolicySource, compile_policy, inspect_policy,
                        policy_resource_scope)
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.events import PolicyChange, PolicyEvents
from pdp.manage import ManagedPolicy, ManagePolicy, Veto, may_manage_policy
from pdp.policy_scope import RESOURCE_ID, confined_resource_ids
from pdp.request import (JOIN_WITH, RequestContext, bind_environment, bind_join, bind_subject,
                         media_kind, parse_request)
from pdp.response import render_response
from pdp.results import (STATUS_SYNTAX_ERROR, AttributeAssignment, Decision, Obligation, Response,
                         Result, RuleGrant, Status)
from pdp.xmlsafe import UnsafeDocumentError, parse_xml

_PERSISTENCE = {
    "PolicyService": "pdp.service", "PolicyIdMismatchError": "pdp.service",
    "Prospect": "pdp.service",
    "seed_store": "pdp.service", "policy_files": "pdp.service", "load_sources": "pdp.service",
    "PolicyStore": "pdp.store", "SQLitePolicyStore": "pdp.store", "SQLPolicyStore": "pdp.store",
    "StoredPolicy": "pdp.store", "StoreUnavailable": "pdp.db",
    "StoreError": "pdp.store", "PolicyExistsError": "pdp.store",
    "PolicyNotFoundError": "pdp.store",
}


def __getattr__(name: str) -> Any:
    module = _PERSISTENCE.get(name)
    if module is None:
        raise AttributeError(f"module 'pdp' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AuthFileError", "Identity", "TokenAuthenticator", "new_token", "write_auth_file",
    "PolicyEngine", "PolicyInfo", "PolicySource", "compile_policy", "inspect_policy",
    "policy_resource_scope",
    "PolicyLoadError", "RequestSyntaxError", "PolicyChange", "PolicyEvents",
    "ManagedPolicy", "ManagePolicy", "Veto", "may_manage_policy",
    "RESOURCE_ID", "confined_resource_ids",
    "JOIN_WITH", "RequestContext", "bind_environment", "bind_join", "bind_subject", "media_kind",
    "parse_request", "render_response",
    "STATUS_SYNTAX_ERROR", "AttributeAssignment", "Decision", "Obligation", "Response", "Result",
    "RuleGrant",
    "Status", "UnsafeDocumentError", "parse_xml",
    *_PERSISTENCE,
]
