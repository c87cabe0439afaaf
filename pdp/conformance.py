"""Conformance runner: `python -m pdp.conformance PATH [--format xml|json] [-v]`.

PATH is a folder of test cases in either layout of conformance/xacml3:
- `mandatory/NAME/`: Policy.xml, Request.xml|json, Response.xml|json; `Request.xml.ignore`
  without Request.xml means the policy must fail to load; `Policy.xml.ignore` means the request
  must be rejected; referenced policies live in `NAMERepository/` or `Policies/` (IIE tests;
  there the root is `Policy.xml`, beside the test or inside that folder).
- `others/NAME/`: `policy.xml` or a `policies/` folder (root: `policies/policy.xml`), with
  `request.xml`/`response.xml`; no request means the policies must fail to load.
PATH may also be one such test folder.

A case passes when our response, rendered in the tested format and read back, is semantically
equal to the expected one: Decision, Status code, Obligations and Advice (order-insensitive,
values compared in canonical lexical form), returned Attributes and, where the expected response
has one, the PolicyIdentifierList.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO, TypedDict

from lxml import etree

from common.pipes import quiet_on_broken_pipe
from common.xmlsafe import parse_json, parse_xml
from pdp.engine import PolicyEngine, PolicySource, inspect_policy
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.request import XACML_NS, normalize_category, normalize_datatype, parse_request
from pdp.response import render_response
from pdp.results import STATUS_OK

# Tests believed wrong, or relying on optional features, with the reason. Empty when every case
# of the suite is expected to pass.
SKIPS: dict[str, str] = {}

MEDIA = {"xml": "application/xacml+xml", "json": "application/xacml+json"}


@dataclass
class Case:
    name: str
    directory: Path
    policies: list[Path]
    root: Path | None
    requests: dict[str, Path]  # format -> request file
    responses: dict[str, Path]
    expect_load_failure: bool = False
    expect_request_failure: bool = False


@dataclass
class SuiteResult:
    passed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        line = f"{len(self.passed)} passed, {len(self.failed)} failed"
        if self.skipped:
            line += f", {len(self.skipped)} skipped"
        return line


# ----------------------------------------------------------------------------- discovery


def _case_from_dir(d: Path) -> Case | None:
    files = {p.name: p for p in d.iterdir()}
    name = d.name
    if "Policy.xml" in files or "Policy.xml.ignore" in files or "Request.xml.ignore" in files \
            or any(n.endswith("Repository") or n == "Policies" for n in files):
        policies: list[Path] = []
        root = files.get("Policy.xml")
        if root is not None:
            policies.append(root)
        for n, p in files.items():
            if p.is_dir() and (n.endswith("Repository") or n == "Policies"):
                for f in sorted(p.glob("*.xml")):
                    policies.append(f)
                    if root is None and f.name == "Policy.xml":
                        root = f
        requests = {fmt: files[f"Request.{fmt}"] for fmt in ("xml", "json")
                    if f"Request.{fmt}" in files}
        responses = {fmt: files[f"Response.{fmt}"] for fmt in ("xml", "json")
                     if f"Response.{fmt}" in files}
        return Case(name, d, policies, root, requests, responses,
                    expect_load_failure=not requests and "Request.xml.ignore" in files,
                    expect_request_failure="Policy.xml.ignore" in files)
    if "policy.xml" in files or "policies" in files:
        if "policies" in files:
            policies = sorted(files["policies"].glob("*.xml"))
            root = files["policies"] / "policy.xml"
            root = root if root.exists() else None
        else:
            policies = [files["policy.xml"]]
            root = files["policy.xml"]
        requests = {fmt: files[f"request.{fmt}"] for fmt in ("xml", "json")
                    if f"request.{fmt}" in files}
        responses = {fmt: files[f"response.{fmt}"] for fmt in ("xml", "json")
                     if f"response.{fmt}" in files}
        return Case(name, d, policies, root, requests, responses,
                    expect_load_failure=not requests)
    return None


def discover(path: Path | str) -> list[Case]:
    path = Path(path)
    single = _case_from_dir(path)
    if single is not None:
        return [single]
    cases = []
    for d in sorted(p for p in path.iterdir() if p.is_dir()):
        case = _case_from_dir(d)
        if case is not None:
            cases.append(case)
    return cases


# ----------------------------------------------------------------------------- normalisation


def _canon_value(datatype: str, value: str) -> str:
    try:
        from pdp.datatypes import get_datatype
        dt = get_datatype(datatype)
        return dt.format(dt.parse(value))
    except Exception:  # noqa: BLE001 - a value its type cannot read is compared as written
        return value


# A response as compared: every part in a canonical form, lists sorted.
NormAssignment = tuple[str, str, str, str, str]  # (id, data type, value, category, issuer)
NormAttribute = tuple[str, str, str, str]  # (id, data type, value, issuer)
NormMissing = tuple[str, str, str, str]  # (category, id, data type, issuer)
NormPolicyRef = tuple[str, str, str]  # (PolicyIdReference or PolicySetIdReference, id, version)
JsonValue = Any  # a member of a parsed JSON response: of any JSON type until checked


class NormResult(TypedDict):
    Decision: str
    Status: str
    MissingAttributeDetail: list[NormMissing] | None
    Obligations: list[tuple[str, tuple[NormAssignment, ...]]]
    Advice: list[tuple[str, tuple[NormAssignment, ...]]]
    Attributes: list[tuple[str, tuple[NormAttribute, ...]]]
    PolicyIdentifierList: list[NormPolicyRef] | None


NormKey = Literal["Decision", "Status", "MissingAttributeDetail", "Obligations", "Advice",
                  "Attributes", "PolicyIdentifierList"]
_NORM_KEYS: tuple[NormKey, ...] = ("Decision", "Status", "MissingAttributeDetail",
                                   "Obligations", "Advice", "Attributes", "PolicyIdentifierList")


def _assignment(attr_id: str, datatype: str, value: str, category: str | None,
                issuer: str | None) -> NormAssignment:
    datatype = normalize_datatype(datatype)
    return (attr_id, datatype, _canon_value(datatype, value),
            normalize_category(category) if category else "", issuer or "")


def _norm_result(decision: str, status: str,
                 obligations: list[tuple[str, list[NormAssignment]]],
                 advice: list[tuple[str, list[NormAssignment]]],
                 attributes: list[tuple[str, list[NormAttribute]]],
                 policy_ids: list[NormPolicyRef] | None,
                 missing: list[NormMissing] | None = None) -> NormResult:
    return {
        "Decision": decision,
        "Status": status,
        "MissingAttributeDetail": sorted(missing) if missing else None,
        "Obligations": sorted((oid, tuple(sorted(a))) for oid, a in obligations),
        "Advice": sorted((aid, tuple(sorted(a))) for aid, a in advice),
        "Attributes": sorted((cat, tuple(sorted(a))) for cat, a in attributes),
        "PolicyIdentifierList": None if policy_ids is None else sorted(policy_ids),
    }


def normalize_xml_response(data: bytes) -> list[NormResult]:
    root = parse_xml(data)
    ns = f"{{{XACML_NS}}}"
    results: list[NormResult] = []
    for res in root.iter(ns + "Result"):
        decision = (res.findtext(ns + "Decision") or "").strip()
        code_el = res.find(f"{ns}Status/{ns}StatusCode")
        status = code_el.get("Value") if code_el is not None else STATUS_OK
        obligations = [(ob.get("ObligationId"), [
            _assignment(a.get("AttributeId"), a.get("DataType"), a.text or "", a.get("Category"),
                        a.get("Issuer")) for a in ob.findall(ns + "AttributeAssignment")])
            for ob in res.findall(f"{ns}Obligations/{ns}Obligation")]
        advice = [(ad.get("AdviceId"), [
            _assignment(a.get("AttributeId"), a.get("DataType"), a.text or "", a.get("Category"),
                        a.get("Issuer")) for a in ad.findall(ns + "AttributeAssignment")])
            for ad in res.findall(f"{ns}AssociatedAdvice/{ns}Advice")]
        attributes: list[tuple[str, list[NormAttribute]]] = []
        for cat in res.findall(ns + "Attributes"):
            attrs: list[NormAttribute] = []
            for at in cat.findall(ns + "Attribute"):
                for v in at.findall(ns + "AttributeValue"):
                    dt = normalize_datatype(v.get("DataType"))
                    attrs.append((at.get("AttributeId"), dt, _canon_value(dt, v.text or ""),
                                  at.get("Issuer") or ""))
            if attrs:
                attributes.append((normalize_category(cat.get("Category")), attrs))
        pil = res.find(ns + "PolicyIdentifierList")
        policy_ids = None
        if pil is not None:
            policy_ids = [(etree_local(p), (p.text or "").strip(), p.get("Version") or "")
                          for p in pil if isinstance(p.tag, str)]
        missing = [(normalize_category(m.get("Category")), m.get("AttributeId"),
                    normalize_datatype(m.get("DataType")), m.get("Issuer") or "")
                   for m in res.findall(f"{ns}Status/{ns}StatusDetail/{ns}MissingAttributeDetail")]
        results.append(_norm_result(decision, status, obligations, advice, attributes,
                                    policy_ids, missing))
    return results


def etree_local(elem: etree._Element) -> str:
    tag: str = elem.tag
    return tag.rsplit("}", 1)[-1]


def _json_list(v: JsonValue) -> list[JsonValue]:
    if v is None:
        return []
    return v if isinstance(v, list) else [v]


def _json_assignments(items: JsonValue) -> list[NormAssignment]:
    return [_assignment(a.get("AttributeId"), a.get("DataType", "string"),
                        _json_str(a.get("Value")), a.get("Category"), a.get("Issuer"))
            for a in _json_list(items)]


def _json_str(v: JsonValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def normalize_json_response(data: bytes) -> list[NormResult]:
    doc = parse_json(data)
    results: list[NormResult] = []
    for res in _json_list(doc.get("Response")):
        status = res.get("Status", {}).get("StatusCode", {}).get("Value", STATUS_OK)
        obligations = [(o.get("Id"), _json_assignments(o.get("AttributeAssignment")))
                       for o in _json_list(res.get("Obligations"))]
        advice = [(o.get("Id"), _json_assignments(o.get("AttributeAssignment")))
                  for o in _json_list(res.get("AssociatedAdvice"))]
        attributes: list[tuple[str, list[NormAttribute]]] = []
        for cat in _json_list(res.get("Category")):
            attrs: list[NormAttribute] = []
            for at in _json_list(cat.get("Attribute")):
                dt = normalize_datatype(at.get("DataType", "string"))
                for v in _json_list(at.get("Value")):
                    attrs.append((at.get("AttributeId"), dt, _canon_value(dt, _json_str(v)),
                                  at.get("Issuer") or ""))
            if attrs:
                attributes.append((normalize_category(cat.get("CategoryId")), attrs))
        policy_ids = None
        pil = res.get("PolicyIdentifierList")
        if pil is not None:
            policy_ids = [(kind, p.get("Id"), p.get("Version") or "")
                          for kind in ("PolicyIdReference", "PolicySetIdReference")
                          for p in _json_list(pil.get(kind))]
        detail = res.get("Status", {}).get("StatusDetail") or {}
        missing = [(normalize_category(m.get("Category")), m.get("AttributeId"),
                    normalize_datatype(m.get("DataType")), m.get("Issuer") or "")
                   for m in _json_list(detail.get("MissingAttributeDetail"))] \
            if isinstance(detail, dict) else []
        results.append(_norm_result(res.get("Decision"), status, obligations, advice, attributes,
                                    policy_ids, missing))
    return results


def normalize_response(data: bytes, fmt: str) -> list[NormResult]:
    return normalize_json_response(data) if fmt == "json" else normalize_xml_response(data)


def _diff(expected: list[NormResult], actual: list[NormResult]) -> str | None:
    if len(expected) != len(actual):
        return f"expected {len(expected)} results, got {len(actual)}"
    # Multiple results may come in any order: match greedily.
    remaining = list(actual)
    for exp in expected:
        # PolicyIdentifierList and MissingAttributeDetail are compared where the expected has them.
        cmp_keys = [k for k in _NORM_KEYS
                    if k not in ("PolicyIdentifierList", "MissingAttributeDetail")
                    or exp[k] is not None]
        for i, act in enumerate(remaining):
            if all(exp[k] == act[k] for k in cmp_keys):
                del remaining[i]
                break
        else:
            best = remaining[0]
            diffs = [f"{k}: expected {exp[k]!r}, got {best[k]!r}" for k in cmp_keys
                     if exp[k] != best[k]]
            return "; ".join(diffs)
    return None


# ----------------------------------------------------------------------------- running


def _sources(case: Case) -> list[PolicySource]:
    return [PolicySource(str(p), p.read_bytes()) for p in case.policies]


def run_case(case: Case, fmt: str) -> tuple[str, str]:
    """('pass'|'fail'|'skip', reason)."""
    if case.name in SKIPS:
        return "skip", SKIPS[case.name]
    sources = _sources(case)
    if case.expect_load_failure:
        try:
            root_id = inspect_policy(PolicySource(str(case.root), case.root.read_bytes())).id \
                if case.root else None
            PolicyEngine.compile(sources, root_policy_id=root_id)
        except PolicyLoadError as exc:
            return "pass", f"refused as expected: {exc}"
        return "fail", "invalid policy was loaded without error"
    req_fmt = fmt if fmt in case.requests else "xml"
    if req_fmt not in case.requests:
        return "fail", f"no request for format {fmt}"
    body = case.requests[req_fmt].read_bytes()
    if case.expect_request_failure:
        try:
            parse_request(body, MEDIA[req_fmt])
        except RequestSyntaxError:
            return "pass", "request refused as expected"
        return "fail", "invalid request was accepted"
    try:
        root_id = inspect_policy(PolicySource(str(case.root), case.root.read_bytes())).id \
            if case.root else None
        engine = PolicyEngine.compile(sources, root_policy_id=root_id)
    except PolicyLoadError as exc:
        return "fail", f"policy failed to load: {exc}"
    response = engine.decide_bytes(body, MEDIA[req_fmt])
    rendered = render_response(response, MEDIA[req_fmt])
    resp_fmt = req_fmt if req_fmt in case.responses else "xml"
    expected = normalize_response(case.responses[resp_fmt].read_bytes(), resp_fmt)
    actual = normalize_response(rendered, req_fmt)
    diff = _diff(expected, actual)
    if diff:
        msg = response.results[0].status.message if response.results else None
        return "fail", diff + (f" [status message: {msg}]" if msg else "")
    return "pass", ""


def run_suite(path: Path | str, fmt: str = "xml", verbose: bool = False,
              out: TextIO | None = None) -> SuiteResult:
    result = SuiteResult()
    for case in discover(path):
        try:
            status, reason = run_case(case, fmt)
        except Exception as exc:  # noqa: BLE001 - the runner reports, it never stops half-way
            status, reason = "fail", f"runner error: {type(exc).__name__}: {exc}"
        if status == "pass":
            result.passed.append(case.name)
            if verbose and out:
                print(f"PASS {case.name} [{fmt}]", file=out)
        elif status == "skip":
            result.skipped.append((case.name, reason))
            if out:
                print(f"SKIP {case.name} [{fmt}]: {reason}", file=out)
        else:
            result.failed.append((case.name, reason))
            if out:
                print(f"FAIL {case.name} [{fmt}]: {reason}", file=out)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdp.conformance",
                                     description="Run XACML 3.0 conformance tests")
    parser.add_argument("path")
    parser.add_argument("--format", choices=("xml", "json"), default="xml")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not Path(args.path).is_dir():
        print(f"no such folder: {args.path}", file=sys.stderr)
        return 2

    def run() -> int:
        result = run_suite(args.path, args.format, args.verbose, sys.stdout)
        print(result.summary())
        return 1 if result.failed else 0

    return quiet_on_broken_pipe(run)


if __name__ == "__main__":
    sys.exit(main())
