"""The linter (`pep.core.lint`) on every policy write: what the written document adds to the
policy set, as warnings in the write's answer (`POST`/`PUT /policies`, their dry runs, each part
of a bulk write), beside those of `pep.streams.policy_check`.

The document is linted with the live policies it could meet (those whose resource scope meets
its own, `PolicyEngine.resource_scope`) and the registered streams with their combining modes;
only the findings about the written document are kept: a rule of its own that can never apply or
is never reached, an obligation the PEP does not understand, a filter that can never hold, and a
grant of its own that cannot be honoured together with another's. The other policies are those
the writer may manage (an administrator: all): a finding never tells an owner about another
owner's policy.
"""
from __future__ import annotations

from common.auth import Identity
from pdp import (
    ManagedPolicy,
    ManagePolicy,
    PolicyEngine,
    PolicyLoadError,
    PolicySource,
    compile_policy,
    policy_combiner,
    policy_resource_scope,
)
from pep.core.lint import LintDocument, LintStream, lint
from pep.streams.catalog import StreamCatalog


def lint_write(document: bytes, source: str, engine: PolicyEngine, catalog: StreamCatalog,
               default_combining: str, identity: Identity | None,
               may_manage: ManagePolicy) -> list[str]:
    """Warnings for a document about to be written (see the module docstring)."""
    try:
        written = compile_policy(PolicySource(source, document))
    except PolicyLoadError:
        return []  # refused before: the write's own check says why
    new_id = written.info.id
    scope = policy_resource_scope(PolicySource(source, document))
    others = []
    for entry in engine.documents():
        other_id = entry.info.id
        if other_id == new_id:
            continue  # the version being replaced
        theirs = engine.resource_scope(other_id)
        if scope is not None and theirs is not None and not scope & theirs:
            continue  # the two can never apply to one request
        if identity is not None and not identity.admin and not may_manage(
                identity, ManagedPolicy.of(entry.info, entry.source.data)):
            continue
        others.append(LintDocument(entry.compiled.evaluator, entry.source.name))
    documents = others + [LintDocument(written.compiled.evaluator, source)]
    streams = [LintStream(d, catalog.combining(d.name) or default_combining)
               for d in catalog.definitions()]
    root = "" if engine.root_policy_id is not None else \
        policy_combiner(engine.root_combining_alg).__name__
    return [f.text() for f in lint(documents, streams, root, focus=[new_id])]


__all__ = ["lint_write"]
