"""Parse and compile XACML 3.0 policy documents into evaluator objects, once, at load time.

This package keeps the public names. The compiler of one document is a few parts, each a class
of its own that is handed the parts it uses (no part inherits another): `reader` (the document
being compiled, its faults and lookups: the state the parts share), `expressions`
(`ExpressionCompiler`), `targets` (`TargetCompiler`), `policies` (`PolicyCompiler`: Policy,
Rule, obligation and advice expressions) and `policy_sets` (`PolicySetCompiler`: PolicySet,
references, the document's root; `compile_document` wires the parts); beside them `model` (what
the compiler hands the engine) and `versions` (Version syntax and matching).

Everything that can be checked without a request is checked here, so that a policy that loads
can only fail at decision time because of the request: unknown functions, datatypes and
combining algorithms, invalid literal values, static type errors in Apply/Match/Condition,
undefined or circular VariableReferences, duplicate Rule/Variable/Policy(Set) ids within a
document, and constant sub-expressions that always fail (they are folded here; a failing one
such as string-substring with a negative index is a load error).

AttributeSelector (XPath) is an optional XACML feature that this PDP does not implement: a policy
using it is refused at load with a message saying so. Policy(Set)IdReferences are compiled into
`ReferenceEvaluator`s and resolved by the engine (pdp.engine), which also detects cycles and
undefined references across documents.
"""
from __future__ import annotations

from pdp.policy_parser.model import (
    CompiledDocument,
    CompiledPolicy,
    MatchSpec,
    PolicyInfo,
    PolicySource,
    RefSpec,
)
from pdp.policy_parser.policy_sets import compile_document
from pdp.policy_parser.versions import MAX_VERSION_TEXT, is_version, version_matches

__all__ = [
    "MAX_VERSION_TEXT", "CompiledDocument", "CompiledPolicy", "MatchSpec", "PolicyInfo",
    "PolicySource", "RefSpec", "compile_document", "is_version", "version_matches",
]
