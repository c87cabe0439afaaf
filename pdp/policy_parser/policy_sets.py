"""Policy sets and documents: a document's root (a <Policy> or a <PolicySet>), a <PolicySet> with
its children and Policy(Set)IdReferences, and `compile_document`, the compiler's entry."""
from __future__ import annotations

from lxml import etree

from pdp.combining import POLICY_COMBINING
from pdp.errors import PolicyLoadError
from pdp.evaluation import ObligationExpr, PolicyEvaluator, ReferenceEvaluator
from pdp.policy_parser.model import CompiledDocument, PolicyInfo, PolicySource, RefSpec
from pdp.policy_parser.policies import PolicyCompiler, attach_index
from pdp.policy_parser.reader import NO_DELEGATION
from pdp.policy_parser.versions import is_version_pattern
from pdp.results import PolicyIdentifier
from pdp.xmlsafe import UnsafeDocumentError, parse_xml


class DocumentCompiler(PolicyCompiler):
    """Compiles one document, whose root is a <Policy> or a <PolicySet>."""

    def compile_root(self, root: etree._Element) -> PolicyEvaluator:
        name = self.local(root)
        if name == "Policy":
            return self.policy(root)
        if name == "PolicySet":
            return self.policy_set(root)
        raise self.fail(f"root element must be <Policy> or <PolicySet>, not <{name}>", root)

    def policy_set(self, elem: etree._Element) -> PolicyEvaluator:
        ps_id = self.required(elem, "PolicySetId")
        version = self.version(elem)
        if ps_id in self.policyset_ids:
            raise self.fail(f"duplicate PolicySetId {ps_id} in the document", elem)
        self.policyset_ids.add(ps_id)
        alg_id = self.required(elem, "PolicyCombiningAlgId")
        combine = POLICY_COMBINING.get(alg_id)
        if combine is None:
            raise self.fail(f"unknown policy-combining algorithm {alg_id}", elem)
        target = None
        spec = None
        children: list[PolicyEvaluator | ReferenceEvaluator] = []
        obligations: list[ObligationExpr] = []
        advice: list[ObligationExpr] = []
        for name, child in self.children(elem):
            if name == "Target":
                target, spec = self.target(child)
            elif name == "Policy":
                children.append(self.policy(child))
            elif name == "PolicySet":
                children.append(self.policy_set(child))
            elif name in ("PolicyIdReference", "PolicySetIdReference"):
                children.append(self.reference(child, name == "PolicySetIdReference"))
            elif name == "ObligationExpressions":
                obligations = self.obligation_exprs(child, "ObligationExpression")
            elif name == "AdviceExpressions":
                advice = self.obligation_exprs(child, "AdviceExpression")
            elif name == "PolicyIssuer":
                raise self.fail(NO_DELEGATION, child)
            elif name in ("Description", "PolicySetDefaults", "CombinerParameters",
                          "PolicyCombinerParameters", "PolicySetCombinerParameters"):
                continue
            else:
                raise self.fail(f"unexpected element <{name}> in <PolicySet>", child)
        ident = PolicyIdentifier(ps_id, version, True)
        ev = PolicyEvaluator(ident, target, combine, children, obligations, advice, spec)
        attach_index(ev)
        return ev

    def reference(self, elem: etree._Element, is_set: bool) -> ReferenceEvaluator:
        ref_id = (elem.text or "").strip()
        if not ref_id:
            raise self.fail("empty policy reference", elem)
        spec = RefSpec(is_set, ref_id, elem.get("Version"), elem.get("EarliestVersion"),
                       elem.get("LatestVersion"))
        for pattern in (spec.version, spec.earliest, spec.latest):
            if pattern is not None and not is_version_pattern(pattern):
                raise self.fail(f"invalid version pattern {pattern!r}", elem)
        self.references.append((spec, elem.sourceline))
        return ReferenceEvaluator(spec, spec.describe())


def compile_document(source: PolicySource, *, max_bytes: int | None = None,
                     max_depth: int | None = None) -> CompiledDocument:
    """Parse and compile one Policy or PolicySet document; raises PolicyLoadError."""
    try:
        root = parse_xml(source.data, max_bytes=max_bytes, max_depth=max_depth)
    except UnsafeDocumentError as exc:
        raise PolicyLoadError(exc.message, source.name, None, exc.line) from None
    compiler = DocumentCompiler(source.name)
    try:
        evaluator = compiler.compile_root(root)
    except RecursionError:
        raise PolicyLoadError("policy nests too deeply", source.name) from None
    except PolicyLoadError:
        raise
    except Exception as exc:  # never let a policy crash the loader with a bare exception
        raise PolicyLoadError(f"cannot compile the policy: {type(exc).__name__}: {exc}",
                              source.name) from None
    evaluator.doc_id = evaluator.identifier.id
    ident = evaluator.identifier
    info = PolicyInfo(ident.id, ident.version, ident.is_policy_set, source.name)
    return CompiledDocument(info, evaluator, compiler.references)
