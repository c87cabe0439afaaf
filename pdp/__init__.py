"""xsg's XACML 3.0 PDP: what the rest of the gateway may use of it.

The engine stays flat in this package (parsing, datatypes, functions, evaluation, combining,
index); the stream side and the proxy import only the names below (`from pdp import ...`;
`tests/test_layout.py` holds them to it). They come in two parts:

- the decision surface, imported eagerly: engine, requests, responses, results, policy
  management rules, policy events, policy scope, XACML's identifiers (`urns`), and what the
  linter and the explanations walk (the compiled evaluators, the compiler's notes, `why`). It is
  pure Python (no Flask, no SQLite), so the PEP's pure core can import it and stay pure;
- the persistence surface (the policy store and the policy service over it), imported on first
  use through `__getattr__` (PEP 562), so that importing `pdp` never loads sqlite3 (or psycopg)
  for a caller that only decides.

What the PDP shares with the rest but is not the PDP (bearer-token identities, numbers, the
error body, the database helpers, hardened XML and JSON loading) is the `common` package's.
The HTTP face (`pdp.http`: the /pdp and /policies blueprint, the PDP's error table) is imported
from there by the HTTP edge only.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from pdp.combining import policy_combiner
from pdp.engine import (
    PolicyEngine,
    PolicyInfo,
    PolicySource,
    compile_policy,
    inspect_policy,
    policy_resource_scope,
)
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.evaluation import (
    DENY,
    PERMIT,
    AnyPolicy,
    AnyValue,
    ObligationExpr,
    PolicyCombiner,
    PolicyEvaluator,
    ReferenceEvaluator,
    RuleCombiner,
    RuleEvaluator,
)
from pdp.events import PolicyChange, PolicyEvents
from pdp.manage import ManagedPolicy, ManagePolicy, Veto, may_manage_policy
from pdp.notes import ALWAYS_FALSE, NO_CONDITION, AttributeKey, MatchNote, Notes, TargetNote
from pdp.policy_parser.expressions import FAST_EQUAL_FUNCTIONS
from pdp.policy_scope import confined_resource_ids
from pdp.request import (
    JOIN_WITH,
    RequestContext,
    bind_environment,
    bind_join,
    bind_subject,
    media_kind,
    parse_request,
)
from pdp.response import render_response
from pdp.results import (
    STATUS_SYNTAX_ERROR,
    AttributeAssignment,
    Decision,
    Obligation,
    Response,
    Result,
    RuleGrant,
    Status,
)
from pdp.target_scope import attribute_key
from pdp.urns import (
    ACCESS_SUBJECT,
    ACTION,
    ACTION_ID,
    CURRENT_DATE,
    CURRENT_DATETIME,
    CURRENT_TIME,
    ENVIRONMENT,
    FUNCTION_PREFIX,
    RESOURCE,
    RESOURCE_ID,
    STRING,
    STRING_EQUAL,
    SUBJECT_ID,
    SUBJECT_ROLE,
    XACML_NS,
)
from pdp.why import explanation_json, explanation_text

if TYPE_CHECKING:  # imported on first use at run time (`__getattr__`); a type checker sees them
    from pdp.service import (
        PolicyIdMismatchError,
        PolicyService,
        Prospect,
        load_sources,
        policy_files,
        seed_store,
    )
    from pdp.store import (
        PolicyExistsError,
        PolicyNotFoundError,
        PolicyStore,
        SQLitePolicyStore,
        SQLPolicyStore,
        StoredPolicy,
    )

_PERSISTENCE = {
    "PolicyService": "pdp.service", "PolicyIdMismatchError": "pdp.service",
    "Prospect": "pdp.service",
    "seed_store": "pdp.service", "policy_files": "pdp.service", "load_sources": "pdp.service",
    "PolicyStore": "pdp.store", "SQLitePolicyStore": "pdp.store", "SQLPolicyStore": "pdp.store",
    "StoredPolicy": "pdp.store", "PolicyExistsError": "pdp.store",
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
    "PolicyEngine", "PolicyInfo", "PolicySource", "compile_policy", "inspect_policy",
    "policy_resource_scope",
    "PolicyLoadError", "RequestSyntaxError", "PolicyChange", "PolicyEvents",
    "ManagedPolicy", "ManagePolicy", "Veto", "may_manage_policy", "confined_resource_ids",
    "JOIN_WITH", "RequestContext", "bind_environment", "bind_join", "bind_subject", "media_kind",
    "parse_request", "render_response",
    "STATUS_SYNTAX_ERROR", "AttributeAssignment", "Decision", "Obligation", "Response", "Result",
    "RuleGrant", "Status",
    # XACML's identifiers
    "ACCESS_SUBJECT", "ACTION", "ACTION_ID", "CURRENT_DATE", "CURRENT_DATETIME", "CURRENT_TIME",
    "ENVIRONMENT", "FUNCTION_PREFIX", "RESOURCE", "RESOURCE_ID", "STRING", "STRING_EQUAL",
    "SUBJECT_ID", "SUBJECT_ROLE", "XACML_NS",
    # what the policy linter and the explanations walk: compiled policies and the compiler's notes
    "DENY", "PERMIT", "AnyPolicy", "PolicyEvaluator", "ReferenceEvaluator", "RuleEvaluator",
    "ObligationExpr", "RuleCombiner", "PolicyCombiner", "AnyValue",
    "ALWAYS_FALSE", "NO_CONDITION", "AttributeKey", "MatchNote", "Notes", "TargetNote",
    "FAST_EQUAL_FUNCTIONS", "attribute_key", "policy_combiner",
    "explanation_json", "explanation_text",
    # persistence, imported on first use (`_PERSISTENCE`): named here one by one, so that a type
    # checker sees them exported
    "PolicyService", "PolicyIdMismatchError", "Prospect", "seed_store", "policy_files",
    "load_sources", "PolicyStore", "SQLitePolicyStore", "SQLPolicyStore", "StoredPolicy",
    "PolicyExistsError", "PolicyNotFoundError",
]
