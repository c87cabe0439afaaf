"""The linter of policy sets (`xsg policy lint`, and the warnings of every policy write).

`paths` reads a compiled document as rules with what surrounds them, `targets` proves what
targets say about the requests they match, `checks` runs the checks (its docstring lists the
kinds of finding). Pure: the PDP's compiled evaluators in, findings out; stream schemas are
handed in (`LintStream`), never looked up.
"""
from __future__ import annotations

from pep.core.lint.checks import (
                                  COLLECTS_PERMITS,
                                  UNDERSTOOD,
                                  Finding,
                                  LintDocument,
                                  LintStream,
                                  lint,
)
from pep.core.lint.paths import RulePath, rule_paths
from pep.core.lint.targets import SINGLE_VALUED, contradiction, implies, pinned_values

__all__ = ["Finding", "LintDocument", "LintStream", "lint", "RulePath", "rule_paths",
           "SINGLE_VALUED", "contradiction", "implies", "pinned_values", "UNDERSTOOD",
           "COLLECTS_PERMITS"]
