"""`xsg policy test` and `xsg policy lint`: a policy author's tools, run without a gateway (lint
also over a running gateway's policies, `--url`).

`xsg policy test PATH...`: the test files (YAML) of `pep.policy_tests`; each case `ok` or
`FAIL` with what differs. Exit 0 when every case passed, 1 when one failed, 2 when a test file
cannot be run (it says file, line and what; the other files still run).

`xsg policy lint [PATH...] [--url]`: the findings of `pep.core.lint`, one a line
(`FILE:LINE: KIND: where: why`). Exit 0 without findings, 1 with some, 2 when a policy cannot
be read.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pep.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, call, gateway_url

# -- xsg policy test ------------------------------------------------------------------------------

def cmd_policy_test(args: argparse.Namespace) -> int:
    from pep.policy_tests import CaseResult, load, run, test_files
    from pep.policy_tests.report import case_lines, junit, summary

    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise CliError(f"{path}: no such file or directory", EXIT_USAGE)
    files = test_files(paths)
    if not files:
        raise CliError(f"no test files (*.yaml, *.yml) in {', '.join(map(str, paths))}",
                       EXIT_USAGE)
    loaded, errors = load(files)
    for error in errors:
        print(f"{error.path}\n  ERROR {error}")
    session: list[Any] = []

    def spark() -> Any:
        if not session:
            from pep.runtime.session import create_spark_session

            print(f"starting Spark ({args.spark_master}) for the stream cases...",
                  file=sys.stderr, flush=True)
            session.append(create_spark_session(args.spark_master, "xsg-policy-test",
                                                {"spark.sql.shuffle.partitions": "2",
                                                 "spark.ui.enabled": "false"},
                                                log_level="ERROR", python_workers=False))
        return session[0]

    shown: list[Path] = []

    def progress(result: CaseResult) -> None:
        if not shown or shown[-1] != result.path:
            shown.append(result.path)
            print(result.path)
        print("\n".join(case_lines(result)), flush=True)

    results = run(loaded, spark, progress)
    print(summary(results, errors))
    if args.junit:
        try:
            Path(args.junit).write_bytes(junit(results, errors))
        except OSError as exc:
            raise CliError(f"cannot write {args.junit}: {exc.strerror or exc}",
                           EXIT_USAGE) from None
    if errors:
        return EXIT_USAGE
    return EXIT_OK if all(r.passed for r in results) else EXIT_FAILED


# -- xsg policy lint ------------------------------------------------------------------------------

def cmd_policy_lint(args: argparse.Namespace) -> int:
    from pdp import PolicyEngine, PolicyLoadError, policy_combiner
    from pep.core.lint import LintDocument, lint

    try:
        root = policy_combiner(args.root_combining).__name__
    except KeyError:
        raise CliError(f"--root-combining {args.root_combining!r}: not a policy-combining "
                       "algorithm", EXIT_USAGE) from None
    if args.lint_url is not None:
        if args.paths:
            raise CliError("give policy files or --url, not both", EXIT_USAGE)
        if args.lint_url:
            args.url = args.lint_url
        sources, streams = _from_gateway(args)
    else:
        if not args.paths:
            raise CliError("give policy files or directories, or --url", EXIT_USAGE)
        paths = [Path(p) for p in args.paths]
        for path in paths:
            if not path.exists():
                raise CliError(f"{path}: no such file or directory", EXIT_USAGE)
        from pep.policy_tests.sources import policy_sources

        try:
            sources = policy_sources(paths)
        except PolicyLoadError as exc:
            raise CliError(f"invalid policy: {exc}", EXIT_USAGE) from None
        streams = _streams_file(args, paths)
    if not sources:
        raise CliError("no Policy or PolicySet documents found", EXIT_USAGE)
    try:
        engine = PolicyEngine.compile(sources, root_combining_alg=args.root_combining)
    except PolicyLoadError as exc:
        raise CliError(f"invalid policy: {exc}", EXIT_USAGE) from None
    documents = [LintDocument(c.compiled.evaluator, c.source.name) for c in engine.documents()]
    findings = lint(documents, streams, root)
    if args.json:
        print(json.dumps([f.to_json() for f in findings], indent=2))
    else:
        for f in findings:
            print(f"{f.source}:{f.line or 0}: {f.kind}: {f.where()}: {f.message}")
        streams_note = f", {len(streams)} stream{'' if len(streams) == 1 else 's'}" \
            if streams else ", no streams (give --streams for the stream checks)"
        print(f"{len(findings)} finding{'' if len(findings) == 1 else 's'} in "
              f"{len(documents)} polic{'y' if len(documents) == 1 else 'ies'}{streams_note}")
    return EXIT_FAILED if findings else EXIT_OK


def _streams_file(args: argparse.Namespace, paths: list[Path]) -> list[Any]:
    """The registrations of --streams, else of a `streams.json` in a directory given."""
    candidates = [Path(args.streams)] if args.streams else \
        [p / "streams.json" for p in paths if p.is_dir() and (p / "streams.json").is_file()]
    if args.streams and not candidates[0].is_file():
        raise CliError(f"--streams {args.streams}: no such file", EXIT_USAGE)
    if not candidates:
        return []
    import tempfile

    from pep.core.lint import LintStream
    from pep.streams.catalog import StreamCatalog, seed_streams
    from pep.streams.definition import StreamError

    with tempfile.TemporaryDirectory(prefix="xsg-lint-") as tmp:
        catalog = StreamCatalog(Path(tmp) / "streams.db", tmp)
        try:
            seed_streams(catalog, candidates[0])
            return [LintStream(e.definition, e.combining or args.combining)
                    for e in catalog.all()]
        except (StreamError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"{candidates[0]}: not a list of stream registrations: "
                           f"{getattr(exc, 'message', exc)}", EXIT_USAGE) from None
        finally:
            catalog.close()


def _from_gateway(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """The policies and streams a running gateway shows the caller (an administrator: all)."""
    from pdp import PolicySource
    from pep.core.lint import LintStream
    from pep.core.plan import SourceSpec, StreamDefinition
    from pep.streams.definition import StreamError, parse_schema

    base = gateway_url(args)[0].rstrip("/")
    sources = []
    for p in call(args, "GET", "/policies").json():
        path = "/policies/" + quote(p["id"], safe="")
        sources.append(PolicySource(f"{base}{path}", call(args, "GET", path).content))
    streams = []
    for s in call(args, "GET", "/streams").json().get("streams", []):
        fields = [{k: v for k, v in f.items() if k != "optional"} for f in s["schema"]]
        try:
            definition = StreamDefinition(s["name"], s["owner"], parse_schema(fields),
                                          SourceSpec(s["source"]["kind"], ()),
                                          s.get("time_attribute"))
        except StreamError:
            continue
        streams.append(LintStream(definition, s.get("combining") or args.combining))
    return sources, streams


# -- the parsers ----------------------------------------------------------------------------------

TEST_DESCRIPTION = """Run policy test files (YAML): for a policy set, which request gets which
decision and obligations; for a stream, which records, request and user query give exactly
which rows (on a local Spark). No gateway is needed. Exit 0: every case passed; 1: a case
failed; 2: a test file cannot be run."""

LINT_DESCRIPTION = """Find what can never apply or is never reached, obligations the PEP does not
understand, grants that cannot be honoured together (a request they both apply to is denied), and
filters that can never hold. Exit 0: nothing found; 1: findings; 2: a policy cannot be read."""


def add_tool_parsers(psub: Any) -> None:
    """`xsg policy test` and `xsg policy lint` (beside the other `xsg policy` actions)."""
    t = psub.add_parser("test", help="run policy test files (no gateway needed)",
                        description=TEST_DESCRIPTION)
    t.add_argument("paths", nargs="+", metavar="PATH",
                   help="test files, or directories searched for *.yaml and *.yml")
    t.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML")
    t.add_argument("--spark-master", default="local[2]",
                   help="Spark for the stream cases (default %(default)s)")
    t.set_defaults(func=cmd_policy_test)
    lint = psub.add_parser("lint", help="find problems in a policy set",
                           description=LINT_DESCRIPTION)
    lint.add_argument("paths", nargs="*", metavar="PATH",
                      help="XACML files, sharing rules (.json, .yaml), or directories of XACML")
    lint.add_argument("--url", dest="lint_url", nargs="?", const="", metavar="URL",
                      help="lint the policies of a running gateway (those your token may "
                           "manage; default URL: XSG_URL)")
    lint.add_argument("--streams", metavar="FILE",
                      help="stream registrations (as policies/streams.json; default: a "
                           "streams.json in a directory given)")
    lint.add_argument("--root-combining", metavar="ALG", default="deny-overrides",
                      help="how the gateway combines its policies (default %(default)s)")
    lint.add_argument("--combining", choices=("intersection", "union"),
                      default="intersection",
                      help="how streams that do not say combine their grants (default "
                           "%(default)s, as the gateway's obligation_combining)")
    lint.add_argument("--json", action="store_true", help="print the findings as JSON")
    lint.set_defaults(func=cmd_policy_lint)


__all__ = ["add_tool_parsers", "cmd_policy_test", "cmd_policy_lint"]
