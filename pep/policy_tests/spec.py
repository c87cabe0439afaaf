"""A policy test file (YAML), read into cases; every mistake in it is a `SpecError` that names
the file, the line and what is wrong.

The format (the documentation's "Policy tests" section shows it whole):

    policies: [../../policies/weather/nea-weather-policy.xml]   # files or directories
    root_combining: deny-overrides          # optional, as `xsg serve --root-combining`
    streams: ../../policies/streams.json    # stream cases: registrations, a file or a list
    cases:
      - name: lta reads weather through Figure 2's obligations
        subject: {id: lta, roles: [consumer], attributes: {clearance: 1}}
        request: {resource: weather, action: read}      # or a request file (XML, JSON Profile)
        expect:
          decision: Permit
          obligations:                                  # exactly these, in any order
            - id: exacml:obligation:stream-filter
              attributes: {pCloud:obligation:stream-filter-condition-id: rainrate > 5}
      - name: lta's windows over ten readings
        stream: weather                                 # a stream case: run on a local Spark
        subject: {id: lta}
        request: {action: read}                         # the resource is the stream
        query: '{"stream": "weather", "filter": "rainrate > 50"}'   # or query_file
        records: records/weather.ndjson                 # or a list of records
        expect:
          rows: [{window_start: 0, window_end: 4, avg_rainrate: 10.0}]
          warnings: [PR map, PR]                        # optional: the merge's warnings, by
                                                        # kind (and operator)

Paths are relative to the test file. Scalars stay text unless YAML reads them as numbers,
booleans or null (a date stays a string, as the gateway writes it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import yaml

from common.auth import AuthFileError, Identity, parse_identity_attributes

XML = "application/xacml+xml"
JSON = "application/xacml+json"
DECISIONS = ("Permit", "Deny", "NotApplicable", "Indeterminate")
REFUSALS = ("denied", "no-result", "invalid", "not-permitted", "not-found", "too-complex",
            "unprocessable")
WARNING_KINDS = ("NR", "PR", "INFO")
WARNING_OPERATORS = ("filter", "map", "window", "join", "union")
NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
STRING = "http://www.w3.org/2001/XMLSchema#string"


class SpecError(Exception):
    """A test file that cannot be run: where (file, line) and what."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        super().__init__(f"{self.path}:{line}: {message}" if line else f"{self.path}: {message}")


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """YAML without implicit timestamps: a date written in a row stays the text it is."""


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


@dataclass(frozen=True)
class ObligationSpec:
    """An obligation (or advice) by its id and its assignments, as a multiset of
    (attribute id, value), which is how expected and actual ones are compared."""

    id: str
    attributes: tuple[tuple[str, str], ...]

    def lines(self) -> list[str]:
        return [self.id] + [f"  {a} = {v}" for a, v in self.attributes]


@dataclass
class Case:
    name: str
    line: int
    request: bytes
    media_type: str
    subject: Identity | None  # who asks, as the gateway would authenticate it
    stream: str | None = None  # a stream case
    records: list[dict[str, Any]] = field(default_factory=list)
    records_line: int | None = None
    query: bytes | None = None
    decision: str | None = None
    obligations: tuple[ObligationSpec, ...] | None = None
    advice: tuple[ObligationSpec, ...] | None = None
    rows: list[dict[str, Any]] | None = None
    ordered: bool = True
    warnings: list[str] | None = None
    refused: str | None = None


@dataclass
class TestFile:
    path: Path
    policies: list[Path]
    root_combining: str
    streams: list[dict[str, Any]]  # registrations, as policies/streams.json holds them
    cases: list[Case]


class _Reader:
    """Reads YAML nodes, each error at its node's line."""

    def __init__(self, path: Path, loader: _Loader) -> None:
        self.path = path
        self.loader = loader

    def fail(self, node: yaml.Node | None, message: str) -> SpecError:
        line = node.start_mark.line + 1 if node is not None else None
        return SpecError(self.path, line, message)

    def value(self, node: yaml.Node) -> Any:
        return self.loader.construct_object(node, deep=True)

    def mapping(self, node: yaml.Node, what: str, known: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str):
                raise self.fail(key_node, f"{what}: keys are names, not {key!r}")
            if key in out:
                raise self.fail(key_node, f"{what}: {key!r} is given twice")
            if key not in known:
                raise self.fail(key_node, f"{what}: unknown key {key!r} (known: "
                                          f"{', '.join(known)})")
            out[key] = value_node
        for key in required:
            if key not in out:
                raise self.fail(node, f"{what}: {key!r} is required")
        return out

    def text(self, node: yaml.Node, what: str) -> str:
        value = self.value(node)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(node, f"{what} must be a non-empty string")
        return value

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"{what} must be a list")
        return list(node.value)

    def file(self, node: yaml.Node, what: str) -> Path:
        path = (self.path.parent / self.text(node, what)).resolve()
        if not path.exists():
            raise self.fail(node, f"{what}: no such file or directory: {path}")
        return path

    def read(self, node: yaml.Node, what: str) -> bytes:
        path = self.file(node, what)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise self.fail(node, f"{what}: cannot read {path}: {exc.strerror or exc}") from None


def read_test_file(path: Path) -> TestFile:
    """The test file at `path`, read and checked (its policies and files found); SpecError."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, None, f"cannot read it: {exc}") from None
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SpecError(path, mark.line + 1 if mark else None,
                        f"not YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise SpecError(path, None, f"not YAML: {exc}") from None
    finally:
        loader.dispose()
    r = _Reader(path, loader)
    if root is None:
        raise SpecError(path, None, "the file is empty")
    top = r.mapping(root, "the test file", ("policies", "root_combining", "streams", "cases"),
                    ("policies", "cases"))
    policies_node = top["policies"]
    items = [policies_node] if isinstance(policies_node, yaml.ScalarNode) else \
        r.sequence(policies_node, "policies")
    policies = [r.file(n, "policies") for n in items]
    if not policies:
        raise r.fail(policies_node, "policies: name at least one file or directory")
    root_combining = r.text(top["root_combining"], "root_combining") \
        if "root_combining" in top else "deny-overrides"
    streams = _streams(r, top["streams"]) if "streams" in top else []
    names = {s.get("name") for s in streams}
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for node in r.sequence(top["cases"], "cases"):
        case = _case(r, node)
        if case.name in seen:
            raise r.fail(node, f"case {case.name!r}: a case of this name is at line "
                               f"{seen[case.name]}")
        seen[case.name] = case.line
        if case.stream is not None and case.stream not in names:
            raise r.fail(node, f"case {case.name!r}: stream {case.stream!r} is not among the "
                               "file's streams (give them with `streams`)")
        cases.append(case)
    if not cases:
        raise r.fail(top["cases"], "cases: the file has no case")
    return TestFile(path, policies, root_combining, streams, cases)


def _streams(r: _Reader, node: yaml.Node) -> list[dict[str, Any]]:
    if isinstance(node, yaml.ScalarNode):
        data = r.read(node, "streams")
        try:
            value = json.loads(data)
        except ValueError as exc:
            raise r.fail(node, f"streams: the file is not JSON: {exc}") from None
    else:
        value = r.value(node)
    if not isinstance(value, list) or not all(isinstance(s, dict) and isinstance(
            s.get("name"), str) and isinstance(s.get("owner"), str) for s in value):
        raise r.fail(node, "streams: a list of registrations, each with a name and an owner "
                           "(as policies/streams.json)")
    return value


CASE_KEYS = ("name", "subject", "request", "stream", "query", "query_file", "records", "expect")


def _case(r: _Reader, node: yaml.Node) -> Case:
    m = r.mapping(node, "a case", CASE_KEYS, ("name", "request", "expect"))
    name = r.text(m["name"], "name")
    what = f"case {name!r}"
    subject = _subject(r, m["subject"], what) if "subject" in m else None
    stream = r.text(m["stream"], f"{what}: stream") if "stream" in m else None
    request, media = _request(r, m["request"], what, stream, subject)
    case = Case(name, node.start_mark.line + 1, request, media, subject, stream)
    if stream is None:
        for key in ("query", "query_file", "records"):
            if key in m:
                raise r.fail(m[key], f"{what}: {key!r} belongs to a stream case (give "
                                     "`stream`)")
    else:
        if subject is None:
            raise r.fail(node, f"{what}: a stream case needs `subject` (who asks)")
        if "query" in m and "query_file" in m:
            raise r.fail(m["query_file"], f"{what}: give `query` or `query_file`, not both")
        if "query" in m:
            case.query = r.text(m["query"], f"{what}: query").encode()
        elif "query_file" in m:
            case.query = r.read(m["query_file"], f"{what}: query_file")
        if "records" not in m:
            raise r.fail(node, f"{what}: a stream case needs `records`")
        case.records = _records(r, m["records"], what)
        case.records_line = m["records"].start_mark.line + 1
    _expect(r, m["expect"], what, case)
    return case


def _subject(r: _Reader, node: yaml.Node, what: str) -> Identity:
    m = r.mapping(node, f"{what}: subject", ("id", "roles", "attributes"), ("id",))
    subject = r.text(m["id"], f"{what}: subject id")
    roles: tuple[str, ...] = ()
    if "roles" in m:
        values = r.value(m["roles"])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise r.fail(m["roles"], f"{what}: subject roles must be a list of strings")
        roles = tuple(values)
    attributes: Any = ()
    if "attributes" in m:
        try:
            attributes = parse_identity_attributes(r.value(m["attributes"]),
                                                   f"{what}: subject attributes")
        except AuthFileError as exc:
            raise r.fail(m["attributes"], str(exc)) from None
    return Identity(subject, roles, False, attributes)


def _request(r: _Reader, node: yaml.Node, what: str, stream: str | None,
             subject: Identity | None) -> tuple[bytes, str]:
    if isinstance(node, yaml.ScalarNode):
        path = r.file(node, f"{what}: request")
        media = JSON if path.suffix.lower() == ".json" else XML
        return r.read(node, f"{what}: request"), media
    m = r.mapping(node, f"{what}: request", ("resource", "action"), ("action",))
    resource = r.text(m["resource"], f"{what}: request resource") if "resource" in m else stream
    if resource is None:
        raise r.fail(node, f"{what}: request: give `resource` (the stream) or a request file")
    if subject is None:
        raise r.fail(node, f"{what}: a request written here needs `subject` (who asks)")
    action = r.text(m["action"], f"{what}: request action")
    return _request_xml(subject.subject, resource, action), XML


def _request_xml(subject: str, resource: str, action: str) -> bytes:
    def attributes(category: str, attribute: str, value: str) -> str:
        return (f'  <Attributes Category="{category}">\n    <Attribute AttributeId="{attribute}" '
                f'IncludeInResult="false">\n      <AttributeValue DataType="{STRING}">'
                f"{escape(value)}</AttributeValue>\n    </Attribute>\n  </Attributes>\n")
    return (f'<Request xmlns="{NS}" ReturnPolicyIdList="false" CombinedDecision="false">\n'
            + attributes("urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
                         "urn:oasis:names:tc:xacml:1.0:subject:subject-id", subject)
            + attributes("urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
                         "urn:oasis:names:tc:xacml:1.0:resource:resource-id", resource)
            + attributes("urn:oasis:names:tc:xacml:3.0:attribute-category:action",
                         "urn:oasis:names:tc:xacml:1.0:action:action-id", action)
            + "</Request>\n").encode()


def _records(r: _Reader, node: yaml.Node, what: str) -> list[dict[str, Any]]:
    if isinstance(node, yaml.ScalarNode):
        data = r.read(node, f"{what}: records")
        out = []
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise r.fail(node, f"{what}: records: line {n} of the file is not JSON: "
                                   f"{exc}") from None
            if not isinstance(record, dict):
                raise r.fail(node, f"{what}: records: line {n} of the file is not an object")
            out.append(record)
        return out
    records = r.value(node)
    if not isinstance(records, list) or not all(isinstance(x, dict) for x in records):
        raise r.fail(node, f"{what}: records must be a list of objects or an NDJSON file")
    return records


def _expect(r: _Reader, node: yaml.Node, what: str, case: Case) -> None:
    if case.stream is None:
        m = r.mapping(node, f"{what}: expect", ("decision", "obligations", "advice"),
                      ("decision",))
        decision = r.text(m["decision"], f"{what}: expect decision")
        if decision not in DECISIONS:
            raise r.fail(m["decision"], f"{what}: decision must be one of "
                                        f"{', '.join(DECISIONS)}, not {decision!r}")
        case.decision = decision
        if "obligations" in m:
            case.obligations = _obligations(r, m["obligations"], f"{what}: obligations")
        if "advice" in m:
            case.advice = _obligations(r, m["advice"], f"{what}: advice")
        return
    m = r.mapping(node, f"{what}: expect", ("rows", "ordered", "warnings", "refused"))
    if ("rows" in m) == ("refused" in m):
        raise r.fail(node, f"{what}: expect `rows` or `refused` (one of them)")
    if "refused" in m:
        refused = r.text(m["refused"], f"{what}: refused")
        if refused not in REFUSALS:
            raise r.fail(m["refused"], f"{what}: refused must be one of {', '.join(REFUSALS)}, "
                                       f"not {refused!r}")
        case.refused = refused
    else:
        rows = r.value(m["rows"])
        if not isinstance(rows, list) or not all(isinstance(x, dict) for x in rows):
            raise r.fail(m["rows"], f"{what}: rows must be a list of objects")
        case.rows = rows
    if "ordered" in m:
        ordered = r.value(m["ordered"])
        if not isinstance(ordered, bool):
            raise r.fail(m["ordered"], f"{what}: ordered is true or false")
        case.ordered = ordered
    if "warnings" in m:
        kinds = r.value(m["warnings"])
        if not isinstance(kinds, list) or not all(_warning(k) for k in kinds):
            raise r.fail(m["warnings"], f"{what}: warnings is a list of kinds "
                                        f"({', '.join(WARNING_KINDS)}), each maybe followed by "
                                        f"its operator ({', '.join(WARNING_OPERATORS)}): PR, "
                                        "`PR map`")
        case.warnings = [" ".join(k.split()) for k in kinds]


def _warning(text: Any) -> bool:
    parts = text.split() if isinstance(text, str) else []
    return (len(parts) in (1, 2) and parts[0] in WARNING_KINDS
            and (len(parts) == 1 or parts[1] in WARNING_OPERATORS))


def _obligations(r: _Reader, node: yaml.Node, what: str) -> tuple[ObligationSpec, ...]:
    out = []
    for item in r.sequence(node, what):
        m = r.mapping(item, what, ("id", "attributes"), ("id",))
        pairs: list[tuple[str, str]] = []
        if "attributes" in m:
            attributes = r.mapping(m["attributes"], f"{what}: attributes",
                                   tuple(str(r.value(k)) for k, _ in m["attributes"].value)
                                   if isinstance(m["attributes"], yaml.MappingNode) else ())
            for attribute, value_node in attributes.items():
                value = r.value(value_node)
                for v in value if isinstance(value, list) else [value]:
                    if isinstance(v, (dict, list)) or v is None:
                        raise r.fail(value_node, f"{what}: {attribute}: a value or a list of "
                                                 "values")
                    pairs.append((attribute, lexical(v)))
        out.append(ObligationSpec(r.text(m["id"], f"{what}: id"), tuple(sorted(pairs))))
    return tuple(sorted(out, key=lambda o: (o.id, o.attributes)))


def lexical(value: Any) -> str:
    """A YAML scalar as the XACML lexical form an obligation's value is compared in."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = ["SpecError", "Case", "TestFile", "ObligationSpec", "read_test_file", "lexical",
           "DECISIONS", "REFUSALS"]
