"""What every part of the policy compiler shares: the document it reads, how it names a fault
(element and line), and the lookups of XACML elements, attributes, datatypes and functions."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from lxml import etree

from pdp.datatypes import DataType, get_datatype
from pdp.errors import PolicyLoadError
from pdp.functions import Function, get_function, signature_error
from pdp.functions.base import ArgSig
from pdp.policy_parser.model import RefSpec
from pdp.policy_parser.versions import is_version
from pdp.urns import XACML_NS

_NS = f"{{{XACML_NS}}}"
# Untrusted (issued) policies belong to the Administration and Delegation profile; treating them
# as trusted would be wrong, so they are refused rather than silently evaluated.
NO_DELEGATION = ("PolicyIssuer (XACML Administration and Delegation profile) is not supported; "
                 "only trusted policies without PolicyIssuer can be loaded")


class DocumentReader:
    """The state of one document's compilation and the checks every element kind uses."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.references: list[tuple[RefSpec, int | None]] = []
        # Ids are unique within a document whatever their versions (the `others/` suite).
        self.policy_ids: set[str] = set()
        self.policyset_ids: set[str] = set()

    def fail(self, message: str, elem: etree._Element | None) -> PolicyLoadError:
        """The load error naming this document, and the element and line when there is one."""
        name = None if elem is None else etree.QName(elem).localname
        line = None if elem is None else elem.sourceline
        return PolicyLoadError(message, self.source, name, line)

    def local(self, elem: etree._Element) -> str:
        """An element's name in the XACML namespace ("" for a comment or processing
        instruction); an element of another namespace is a load error."""
        tag = elem.tag
        if not isinstance(tag, str):
            return ""
        if tag.startswith(_NS):
            return tag[len(_NS):]
        raise self.fail(f"element {tag} is not in the XACML 3.0 namespace {XACML_NS}", elem)

    def children(self, elem: etree._Element) -> Iterator[tuple[str, etree._Element]]:
        """(name, element) of each child element, comments and instructions left out."""
        for child in elem:
            name = self.local(child)
            if name:
                yield name, child

    def required(self, elem: etree._Element, attr: str) -> str:
        """The trimmed value of an attribute the element must have."""
        value = elem.get(attr)
        if value is None or not value.strip():
            raise self.fail(f"missing required attribute {attr}", elem)
        return str(value.strip())

    def version(self, elem: etree._Element) -> str:
        """The Version of a Policy or PolicySet ("1.0" when absent), checked."""
        version = (elem.get("Version") or "1.0").strip()
        if not is_version(version):
            raise self.fail(f"invalid Version {version!r}", elem)
        return str(version)

    def datatype(self, dt_id: str, elem: etree._Element) -> DataType:
        try:
            return get_datatype(dt_id)
        except KeyError:
            raise self.fail(f"unknown DataType {dt_id}", elem) from None

    def function(self, fid: str, elem: etree._Element) -> Function:
        try:
            return get_function(fid)
        except KeyError:
            raise self.fail(f"unknown function {fid}", elem) from None

    def check_signature(self, func: Function, sigs: Sequence[ArgSig], elem: etree._Element,
                        inner: Function | None = None) -> None:
        """A static type error of a call (arity, argument types, bags) is a load error."""
        err = signature_error(func, sigs, inner) if func.higher_order else \
            signature_error(func, sigs)
        if err:
            raise self.fail(f"type error in {func.id}: {err}", elem)
