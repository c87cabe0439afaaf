"""Exact NR/PR analysis of filters, and the final filter as DNF for the execution plan.

NR (no result): the policy's and the user's conditions can never hold together.
PR (partial result): some tuple that the user's condition accepts is withheld by the policy, i.e.
`user AND NOT policy` is satisfiable.

Method (eXACML+ section 3.5, made exact):
1. NOT is pushed down to the comparisons (De Morgan and Table 2: NOT(x > v) is x <= v).
2. The result is expanded to DNF by distribution, pruning each conjunct the moment it becomes
   unsatisfiable, with a bound on its size (an AND of ten two-way ORs has 1024 conjuncts).
3. A conjunct is satisfiable when, for every attribute, its interval (open or closed bounds),
   equalities and inequalities leave a value: over the reals for double attributes (double
   semantics: their constants are doubles already, rounded as the attribute's values are), over
   the 64-bit integers for long ones and over the microseconds of years 1 to 9999 for timestamps
   (exactly, with Python's integers: `n > 2^53 AND n < 2^53 + 2` leaves one value, and with
   `n != 2^53 + 1` none; `n > 2^63 - 1` none), over strings in code-point order (where
   `s > 'a' AND s < 'a\\0'` is empty), over {true, false} for booleans.

Missing attributes are taken into account: a comparison over a missing value is false, so a tuple
that lacks an attribute the policy's filter needs is withheld (PR) even if the policy's filter is
a tautology over present values.

Spatial predicates (DISTANCE, DISTANCE_TO, WITHIN_POLYGON) are sound and conservative rather than
exact. Each becomes an atom over a *derived variable* (the distance to one point, the distance to
one anchor, inside one polygon), so predicates on the same variable are decided exactly (a policy's
`DISTANCE(...) <= 50000` and a query's `DISTANCE(...) <= 20000` with the same point; the same
polygon inside and outside). A positive DISTANCE (< or <=) or WITHIN_POLYGON also implies a
lat/lon bounding box, added as *implied* atoms, so a contradiction with other latitude and
longitude ranges is found by the interval check. Across variables on the same coordinates:
two circles (triangle inequality on the sphere: inside C1 and outside C2 is empty when
d(p1, p2) + r1 < r2, two insides are disjoint when d(p1, p2) > r1 + r2, each with a 1 m margin for
rounding), and a convex polygon containing another polygon or a lat/lon box (all its vertices or
corners inside; polygons are planar in lat/lon, so this is exact up to rounding at the edge).
Everything else is assumed satisfiable: NR is never reported falsely, and PR is reported where
the analysis cannot tell, with the warning saying that it could not decide. DISTANCE_TO is
decided only against the same anchor.

The DNF is our own rather than sympy's `to_dnf`: on these small formulas sympy takes about 1 ms
per call (over the whole budget of a request), cannot prune while it expands, and does not
know the theory anyway. The tests use sympy as an independent oracle for the boolean part.

The steps, one module each: `atoms` (limits, findings, atoms, negation normal form), `conjuncts`
(one conjunct's satisfiability, the DNF, the plan's predicates), `filters` (the policy's and the
consumer's filters analysed together). Callers import the names below from `pep.core.analysis`.
"""
from __future__ import annotations

from pep.core.analysis.atoms import (
                                     ANALYSIS_LIMIT,
                                     CONTAINMENT_LIMIT,
                                     DISTANCE_MARGIN_M,
                                     MASKED,
                                     NEVER,
                                     NNF,
                                     PLAN_LIMIT,
                                     SPATIAL,
                                     WORK_LIMIT,
                                     Atom,
                                     ConditionTooComplex,
                                     Constant,
                                     MergeWarning,
                                     MergeWarningJson,
                                     RawBound,
                                     TooLarge,
                                     to_nnf,
)
from pep.core.analysis.conjuncts import Atoms, Checker, Constraint, values_satisfiable
from pep.core.analysis.filters import FilterAnalysis, analyse_filter

__all__ = ["ANALYSIS_LIMIT", "CONTAINMENT_LIMIT", "DISTANCE_MARGIN_M", "MASKED", "NEVER",
           "PLAN_LIMIT", "SPATIAL", "WORK_LIMIT", "Atom", "ConditionTooComplex", "Constant",
           "MergeWarning", "MergeWarningJson", "NNF", "RawBound", "TooLarge", "to_nnf", "Atoms",
           "Checker", "Constraint", "values_satisfiable", "FilterAnalysis", "analyse_filter"]
