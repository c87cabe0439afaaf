"""Stream cases: records, a request (and a user query) give exactly these rows, on a local Spark.

Nothing here re-implements the gateway: the streams are registered in a scratch catalogue (the
gateway's `StreamCatalog`, its sources made `ingest`: the test's records are the input), each
request is decided and planned by `decide_and_plan` with the catalogue's lookups (as `POST
/requests` does), its plan attached to a `StreamRuntime` (the shared Structured Streaming query
of the stream), the records appended through the catalogue's ingest (validated, numbered,
written whole) and processed; the rows are what the runtime delivered to the handle.

The cases of one file on the same stream with the same records share one run (one query, one
handle each). The rows a case gets are those a reader would have after the records: a time
window the watermark has not passed yet is not among them.
"""
from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdp import PolicyEngine
from pep.core.access import Grant, decide_and_plan
from pep.core.errors import (
    AccessDenied,
    InvalidInput,
    NoResult,
    NotFound,
    NotPermitted,
    Refusal,
    TooComplex,
    Unprocessable,
)
from pep.core.plan import JoinPlan
from pep.core.schemas import BUILTIN_SCHEMAS, BUILTIN_TIME_ATTRIBUTES
from pep.core.union import INTERSECTION
from pep.policy_tests.spec import Case, SpecError, TestFile
from pep.streams.catalog import StreamCatalog
from pep.streams.definition import StreamError, parse_combining
from pep.streams.records import RecordError, validate_records

# what a refused request is called in a test file, by the kind of refusal (most special first)
REFUSAL_KINDS: tuple[tuple[type[Refusal], str], ...] = (
    (AccessDenied, "denied"), (NoResult, "no-result"), (TooComplex, "too-complex"),
    (Unprocessable, "unprocessable"), (NotFound, "not-found"), (NotPermitted, "not-permitted"),
    (InvalidInput, "invalid"))


def refusal_kind(exc: Refusal) -> str:
    return next((name for kind, name in REFUSAL_KINDS if isinstance(exc, kind)),
                type(exc).__name__)


@dataclass
class StreamResult:
    """What a stream case got: its rows and the merge's warnings, or a refusal."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # "KIND operator: message"
    refused: str | None = None
    reason: str | None = None


class _Rows:
    """A handle's deliver callback: the rows of every batch, decoded."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: Any) -> bool:
        with self.lock:
            self.rows.extend(json.loads(text) for text in batch.rows)
        return True


def scratch_catalog(test: TestFile, directory: Path) -> StreamCatalog:
    """The file's streams registered as the gateway registers them, each fed by its own
    ingest directory (a generator's schema and time attribute are its built-in ones)."""
    catalog = StreamCatalog(directory / "streams.db", directory)
    try:
        for entry in test.streams:
            schema, time_attribute = entry.get("schema"), entry.get("time_attribute")
            source = entry.get("source") or {}
            if isinstance(source, dict) and source.get("kind") == "generator":
                builtin = str(source.get("schema"))
                schema = schema or BUILTIN_SCHEMAS.get(builtin)
                time_attribute = time_attribute or BUILTIN_TIME_ATTRIBUTES.get(builtin)
            catalog.register(entry["name"], entry["owner"], schema, {"kind": "ingest"},
                             time_attribute, trusted=True, lateness=entry.get("lateness"))
            if entry.get("combining") is not None:
                catalog.update(entry["name"], {"combining": parse_combining(entry["combining"])},
                               by=entry["owner"])
    except (StreamError, KeyError) as exc:
        catalog.close()
        raise SpecError(test.path, None, f"streams: {getattr(exc, 'message', exc)}") from None
    return catalog


def check_records(test: TestFile, catalog: StreamCatalog) -> None:
    """Every stream case's records fit its stream (the ingest's own validation); SpecError."""
    for case in test.cases:
        if case.stream is None:
            continue
        entry = catalog.entry(case.stream)
        assert entry is not None
        try:
            validate_records(entry.definition.schema, _ndjson(case.records),
                             entry.definition.time_attribute)
        except RecordError as exc:
            at = ", ".join(p for p in (f"record {exc.line}" if exc.line else "",
                                       f"field {exc.field!r}" if exc.field else "") if p)
            raise SpecError(test.path, case.records_line, f"case {case.name!r}: records"
                            f"{f' ({at})' if at else ''}: {exc.detail}") from None


def _ndjson(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def run_stream_cases(test: TestFile, engine: PolicyEngine, spark: Callable[[], Any]
                     ) -> dict[str, StreamResult]:
    """Each stream case's result, by case name (`spark()` gives the session, made once)."""
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime

    groups: dict[tuple[str, str], list[Case]] = {}
    for case in test.cases:
        if case.stream is not None:
            key = (case.stream, json.dumps(case.records, sort_keys=True))
            groups.setdefault(key, []).append(case)
    results: dict[str, StreamResult] = {}
    for (stream, _), cases in groups.items():
        with tempfile.TemporaryDirectory(prefix="xsg-policy-test-") as tmp:
            catalog = scratch_catalog(test, Path(tmp))
            runtime = StreamRuntime(spark(), Path(tmp) / "runtime", settings=RuntimeSettings(
                trigger_interval=0.1, max_files_per_trigger=1000, janitor_interval=60.0))
            attached: list[tuple[Case, Grant, _Rows]] = []
            try:
                for n, case in enumerate(cases):
                    try:
                        grant = _plan(engine, catalog, case)
                    except Refusal as exc:
                        results[case.name] = StreamResult(refused=refusal_kind(exc),
                                                          reason=str(exc))
                        continue
                    if isinstance(grant.plan, JoinPlan):
                        results[case.name] = StreamResult(
                            refused="unsupported", reason="the query asks for a join, which "
                            "policy tests do not run (they feed one stream)")
                        continue
                    rows = _Rows()
                    definition = catalog.get(stream)
                    assert definition is not None
                    runtime.attach_handle(f"case-{n}", definition, grant.plan, rows)
                    attached.append((case, grant, rows))
                if attached:
                    catalog.append_records(stream, _ndjson(cases[0].records))
                    runtime.process_available(stream)
                for case, grant, rows in attached:
                    results[case.name] = StreamResult(list(rows.rows), [
                        f"{w.kind} {w.operator}: {w.message}" for w in grant.warnings])
            finally:
                for n in range(len(cases)):  # the query stops with its last handle
                    runtime.detach(f"case-{n}")
                runtime.stop()
                catalog.close()
    return results


def _plan(engine: PolicyEngine, catalog: StreamCatalog, case: Case) -> Grant:
    """The case's request decided and planned as `POST /requests` decides and plans it."""
    assert case.subject is not None
    return decide_and_plan(
        engine, case.request, case.media_type, case.subject, catalog.schema,
        case.query, None, time_attribute_lookup=catalog.time_attribute,
        combining=lambda stream: catalog.combining(stream) or INTERSECTION)


__all__ = ["StreamResult", "run_stream_cases", "scratch_catalog", "check_records",
           "refusal_kind"]
