"""Policy sets and documents: a document's root (a <Policy> or a <PolicySet>), a <PolicySet> with
its children and Policy(Set)IdReferences, and `compile_document`, the compiler's entry."""
from __future__ import annotations

from lxml import etree

from common.xmlsafe import UnsafeDocumentError, parse_xml
from pdp.combining import POLICY_COMBINING
from pdp.errors import PolicyLoadError
from pdp.evaluation import AnyPolicy, ObligationExpr, PolicyEvaluator, PolicySet, ReferenceEvaluator
from pdp.notes import Notes, TargetNote
from pdp.policy_parser.expressions import ExpressionCompiler
from pdp.policy_parser.model import CompiledDocument, PolicyInfo, PolicySource, RefSpec
from pdp.policy_parser.policies import PolicyCompiler, attach_index
from pdp.policy_parser.reader import NO_DELEGATION, DocumentReader
from pdp.policy_parser.targets import TargetCompiler
from pdp.policy_parser.versions import is_version_pattern
from pdp.results import PolicyIdentifier


class PolicySetCompiler:
    """Compiles one document's root, a <Policy> or a <PolicySet>: policy sets and references
    here, policies by the `PolicyCompiler`, targets by the `TargetCompiler`."""

    def __init__(self, reader: DocumentReader, targets: TargetCompiler,
                 policies: PolicyCompiler) -> None:
        self.reader = reader
        self.targets = targets
        self.policies = policies

    @classmethod
    def for_document(cls, source: str) -> PolicySetCompiler:
        """The compiler of one document: its reader and the parts that share it."""
        reader = DocumentReader(source)
        expressions = ExpressionCompiler(reader)
        targets = TargetCompiler(reader, expressions)
        return cls(reader, targets, PolicyCompiler(reader, expressions, targets))

    def compile_root(self, root: etree._Element) -> AnyPolicy:
        name = self.reader.local(root)
        if name == "Policy":
            return self.policies.policy(root)
        if name == "PolicySet":
            return self.policy_set(root)
        raise self.reader.fail(f"root element must be <Policy> or <PolicySet>, not <{name}>", root)

    def policy_set(self, elem: etree._Element) -> PolicySet:
        ps_id = self.reader.required(elem, "PolicySetId")
        version = self.reader.version(elem)
        if ps_id in self.reader.policyset_ids:
            raise self.reader.fail(f"duplicate PolicySetId {ps_id} in the document", elem)
        self.reader.policyset_ids.add(ps_id)
        alg_id = self.reader.required(elem, "PolicyCombiningAlgId")
        combine = POLICY_COMBINING.get(alg_id)
        if combine is None:
            raise self.reader.fail(f"unknown policy-combining algorithm {alg_id}", elem)
        target = None
        spec = None
        target_note: TargetNote = ()
        children: list[AnyPolicy | ReferenceEvaluator] = []
        obligations: list[ObligationExpr] = []
        advice: list[ObligationExpr] = []
        for name, child in self.reader.children(elem):
            if name == "Target":
                target, spec, target_note = self.targets.target(child)
            elif name == "Policy":
                children.append(self.policies.policy(child))
            elif name == "PolicySet":
                children.append(self.policy_set(child))
            elif name in ("PolicyIdReference", "PolicySetIdReference"):
                children.append(self.reference(child, name == "PolicySetIdReference"))
            elif name == "ObligationExpressions":
                obligations = self.policies.obligation_exprs(child, "ObligationExpression")
            elif name == "AdviceExpressions":
                advice = self.policies.obligation_exprs(child, "AdviceExpression")
            elif name == "PolicyIssuer":
                raise self.reader.fail(NO_DELEGATION, child)
            elif name in ("Description", "PolicySetDefaults", "CombinerParameters",
                          "PolicyCombinerParameters", "PolicySetCombinerParameters"):
                continue
            else:
                raise self.reader.fail(f"unexpected element <{name}> in <PolicySet>", child)
        ident = PolicyIdentifier(ps_id, version, True)
        notes = Notes(elem.sourceline, target_note, algorithm=alg_id)
        ev: PolicySet = PolicyEvaluator(ident, target, combine, children, obligations, advice,
                                        spec, notes=notes)
        attach_index(ev)
        return ev

    def reference(self, elem: etree._Element, is_set: bool) -> ReferenceEvaluator:
        ref_id = (elem.text or "").strip()
        if not ref_id:
            raise self.reader.fail("empty policy reference", elem)
        spec = RefSpec(is_set, ref_id, elem.get("Version"), elem.get("EarliestVersion"),
                       elem.get("LatestVersion"))
        for pattern in (spec.version, spec.earliest, spec.latest):
            if pattern is not None and not is_version_pattern(pattern):
                raise self.reader.fail(f"invalid version pattern {pattern!r}", elem)
        self.reader.references.append((spec, elem.sourceline))
        return ReferenceEvaluator(spec, spec.describe())


def compile_document(source: PolicySource, *, max_bytes: int | None = None,
                     max_depth: int | None = None) -> CompiledDocument:
    """Parse and compile one Policy or PolicySet document; raises PolicyLoadError."""
    try:
        root = parse_xml(source.data, max_bytes=max_bytes, max_depth=max_depth)
    except UnsafeDocumentError as exc:
        raise PolicyLoadError(exc.message, source.name, None, exc.line) from None
    compiler = PolicySetCompiler.for_document(source.name)
    try:
        evaluator = compiler.compile_root(root)
    except RecursionError:
        raise PolicyLoadError("policy nests too deeply", source.name) from None
    except PolicyLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - never let a policy crash the loader with a bare exception
        raise PolicyLoadError(f"cannot compile the policy: {type(exc).__name__}: {exc}",
                              source.name) from None
    evaluator.doc_id = evaluator.identifier.id
    ident = evaluator.identifier
    info = PolicyInfo(ident.id, ident.version, ident.is_policy_set, source.name)
    return CompiledDocument(info, evaluator, compiler.reader.references)
