"""Running policy test files: every file read and checked first (a bad one stops the run before
anything is decided), then each decision case decided by the PDP as the gateway decides
(`PolicyEngine`, the subject bound as the caller), each stream case run on Spark
(`pep.policy_tests.streams`), and each result compared with what the case expects.

Comparisons: a decision exactly; obligations and advice as multisets of (id, assignments); rows
as JSON values, numbers within a relative 1e-9 (floating point sums), in order unless the case
says `ordered: false`; warnings as a multiset of kinds. A failure says what differs, as a diff of
expected and actual lines, and for a decision why the PDP decided as it did (`pdp.why`).
"""
from __future__ import annotations

import difflib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdp import (
    Obligation,
    PolicyEngine,
    PolicyLoadError,
    RequestSyntaxError,
    bind_environment,
    bind_subject,
    explanation_json,
    explanation_text,
    parse_request,
)
from pep.policy_tests.sources import policy_sources
from pep.policy_tests.spec import Case, ObligationSpec, SpecError, TestFile, read_test_file
from pep.policy_tests.streams import StreamResult, check_records, run_stream_cases, scratch_catalog

TEST_SUFFIXES = (".yaml", ".yml")


@dataclass
class CaseResult:
    path: Path
    case: Case
    passed: bool
    details: list[str] = field(default_factory=list)  # what differs, line by line
    seconds: float = 0.0


@dataclass
class Loaded:
    test: TestFile
    engine: PolicyEngine


def test_files(paths: Sequence[Path]) -> list[Path]:
    """The test files of `paths` (a directory: every *.yaml and *.yml under it)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix.lower() in TEST_SUFFIXES
                                and p.is_file()))
        else:
            found.append(path)
    return found


def load(paths: Sequence[Path]) -> tuple[list[Loaded], list[SpecError]]:
    """Every test file read, its policies compiled, its streams registered (in a scratch
    catalogue) and its records checked; the errors of those that cannot be run."""
    import tempfile

    loaded: list[Loaded] = []
    errors: list[SpecError] = []
    for path in paths:
        try:
            test = read_test_file(path)
            try:
                engine = PolicyEngine.compile(policy_sources(test.policies),
                                              root_combining_alg=test.root_combining)
            except PolicyLoadError as exc:
                raise SpecError(path, None, f"policies: {exc}") from None
            for case in test.cases:
                try:
                    parse_request(case.request, case.media_type)
                except RequestSyntaxError as exc:
                    raise SpecError(path, case.line, f"case {case.name!r}: the request does "
                                                     f"not parse: {exc}") from None
            if any(c.stream is not None for c in test.cases):
                with tempfile.TemporaryDirectory(prefix="xsg-policy-test-") as tmp:
                    catalog = scratch_catalog(test, Path(tmp))
                    try:
                        check_records(test, catalog)
                    finally:
                        catalog.close()
        except SpecError as exc:
            errors.append(exc)
            continue
        loaded.append(Loaded(test, engine))
    return loaded, errors


def run(loaded: Iterable[Loaded], spark: Callable[[], Any],
        progress: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Every case of every file, in file order; `spark()` is asked for a session only when a
    file has stream cases."""
    results: list[CaseResult] = []
    for item in loaded:
        test, engine = item.test, item.engine
        started = time.perf_counter()
        streamed: dict[str, StreamResult] = {}
        if any(c.stream is not None for c in test.cases):
            streamed = run_stream_cases(test, engine, spark)
        stream_seconds = time.perf_counter() - started
        for case in test.cases:
            began = time.perf_counter()
            if case.stream is None:
                result = decision_case(test.path, engine, case)
            else:
                result = stream_case(test.path, case, streamed[case.name])
                result.seconds = stream_seconds / max(1, sum(1 for c in test.cases if c.stream))
            result.seconds = result.seconds or time.perf_counter() - began
            results.append(result)
            if progress is not None:
                progress(result)
    return results


# -- decisions ------------------------------------------------------------------------------------

def _specs(obligations: Iterable[Obligation]) -> tuple[ObligationSpec, ...]:
    return tuple(sorted((ObligationSpec(o.id, tuple(sorted((a.attribute_id, a.value)
                                                           for a in o.assignments)))
                         for o in obligations), key=lambda o: (o.id, o.attributes)))


def decision_case(path: Path, engine: PolicyEngine, case: Case) -> CaseResult:
    ctx = parse_request(case.request, case.media_type)
    if case.subject is not None:  # as the gateway decides: the caller is the subject
        ctx = bind_environment(bind_subject(ctx, case.subject), [])
    response = engine.decide(ctx)
    if len(response.results) != 1:
        return CaseResult(path, case, False, [
            f"the request holds {len(response.results)} individual decisions; a case decides "
            "one"])
    result = response.results[0]
    details: list[str] = []
    got = result.decision.value
    if got != case.decision:
        details.append(f"decision: expected {case.decision}, got {got}"
                       + (f" ({result.status.message})" if result.status.message and
                          got == "Indeterminate" else ""))
    for what, expected, actual in (("obligations", case.obligations, result.obligations),
                                   ("advice", case.advice, result.advice)):
        if expected is None:
            continue
        specs = _specs(actual)
        if specs != expected:
            details.append(f"{what}:")
            details.extend("  " + line for line in _diff(
                [line for o in expected for line in o.lines()],
                [line for o in specs for line in o.lines()]))
    if details and got != case.decision:
        _, explanations = engine.explain(ctx)
        details.append("why:")
        details.extend("  " + line for line in explanation_text(
            explanation_json(explanations[0])).splitlines())
    return CaseResult(path, case, not details, details)


# -- streams --------------------------------------------------------------------------------------

def stream_case(path: Path, case: Case, got: StreamResult) -> CaseResult:
    details: list[str] = []
    if case.refused is not None:
        if got.refused != case.refused:
            details.append(f"expected the request to be refused ({case.refused}), but "
                           + (f"it was refused ({got.refused}): {got.reason}" if got.refused
                              else f"it was permitted and gave {len(got.rows)} rows"))
    elif got.refused is not None:
        details.append(f"expected rows, but the request was refused ({got.refused}): "
                       f"{got.reason}")
    else:
        expected = case.rows or []
        if not rows_equal(expected, got.rows, case.ordered):
            details.append(f"rows: expected {len(expected)}, got {len(got.rows)}"
                           + ("" if case.ordered else " (in any order)"))
            exp_lines, act_lines = [_line(r) for r in expected], [_line(r) for r in got.rows]
            if not case.ordered:
                exp_lines, act_lines = sorted(exp_lines), sorted(act_lines)
            details.extend("  " + line for line in _diff(exp_lines, act_lines))
    if case.warnings is not None and got.refused is None \
            and not warnings_match(case.warnings, got.warnings):
        details.append(f"warnings: expected [{', '.join(case.warnings)}], got:")
        details.extend(f"  {w}" for w in got.warnings)
        if not got.warnings:
            details[-1] += " none"
    return CaseResult(path, case, not details, details)


def warnings_match(expected: list[str], actual: list[str]) -> bool:
    """Each expected warning ("PR", or "PR map": kind and operator) matches one actual warning
    ("KIND operator: message"), and none is left over."""
    left = [w.split(":", 1)[0].split() for w in actual]
    for want in sorted(expected, key=lambda w: -len(w.split())):  # the precise ones first
        parts = want.split()
        match = next((i for i, got in enumerate(left) if got[:len(parts)] == parts), None)
        if match is None:
            return False
        left.pop(match)
    return not left


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, ensure_ascii=False)


def values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def rows_equal(expected: list[dict[str, Any]], actual: list[dict[str, Any]],
               ordered: bool = True) -> bool:
    if len(expected) != len(actual):
        return False
    if ordered:
        return all(values_equal(e, a) for e, a in zip(expected, actual, strict=True))
    left = list(actual)
    for e in expected:
        match = next((i for i, a in enumerate(left) if values_equal(e, a)), None)
        if match is None:
            return False
        left.pop(match)
    return True


def _diff(expected: list[str], actual: list[str]) -> list[str]:
    return list(difflib.unified_diff(expected, actual, "expected", "actual", lineterm="", n=2))


__all__ = ["CaseResult", "Loaded", "test_files", "load", "run", "decision_case",
           "stream_case", "rows_equal", "values_equal"]
