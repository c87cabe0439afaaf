"""What `xsg policy test` prints, and the JUnit XML a CI server reads (`--junit FILE`)."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from pep.policy_tests.run import CaseResult
from pep.policy_tests.spec import SpecError


def case_lines(result: CaseResult, shown: Path | None = None) -> list[str]:
    """One case: `ok` or `FAIL`, its name and line, and for a failure what differs."""
    kind = f"stream {result.case.stream}" if result.case.stream else "decision"
    head = (f"  {'ok  ' if result.passed else 'FAIL'}  {result.case.name} "
            f"({kind}, line {result.case.line})")
    return [head] + [f"        {line}" for line in result.details]


def summary(results: Sequence[CaseResult], errors: Sequence[SpecError]) -> str:
    failed = sum(1 for r in results if not r.passed)
    files = len({r.path for r in results})
    text = (f"{len(results)} case{'' if len(results) == 1 else 's'} in {files} "
            f"file{'' if files == 1 else 's'}: {len(results) - failed} passed, {failed} failed")
    if errors:
        text += f"; {len(errors)} file{'' if len(errors) == 1 else 's'} could not be run"
    return text


def junit(results: Sequence[CaseResult], errors: Sequence[SpecError]) -> bytes:
    """One testsuite per file, one testcase per case (a failure's text: what differs); a file
    that could not be run is a testsuite with one error."""
    root = ET.Element("testsuites", name="xsg policy test")
    by_file: dict[str, list[CaseResult]] = {}
    for r in results:
        by_file.setdefault(str(r.path), []).append(r)
    for path, items in by_file.items():
        suite = ET.SubElement(root, "testsuite", name=path, tests=str(len(items)),
                              failures=str(sum(1 for r in items if not r.passed)), errors="0",
                              time=f"{sum(r.seconds for r in items):.3f}")
        for r in items:
            case = ET.SubElement(suite, "testcase", name=r.case.name, classname=path,
                                 time=f"{r.seconds:.3f}")
            if not r.passed:
                failure = ET.SubElement(case, "failure",
                                        message=r.details[0] if r.details else "failed")
                failure.text = "\n".join(r.details)
    for error in errors:
        suite = ET.SubElement(root, "testsuite", name=error.path, tests="1", failures="0",
                              errors="1")
        case = ET.SubElement(suite, "testcase", name="the test file", classname=error.path)
        ET.SubElement(case, "error", message=str(error)).text = str(error)
    return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))


__all__ = ["case_lines", "summary", "junit"]
