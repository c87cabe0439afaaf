"""The request model both forms end in: attributes, category instances, individual decisions.

Values are parsed into their datatype once, when a category instance is built: a value that
does not fit its datatype is a syntax error of the request (said with where it is), not an
evaluation error later on. Multiple Decision Profile: a request with two instances of one
category asks for one decision per combination; `RequestContext.individuals()` expands them.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from pdp import datatypes
from pdp.errors import RequestSyntaxError, ValueSyntaxError
from pdp.results import STATUS_PROCESSING_ERROR, ResultAttribute, ResultCategory
from pdp.urns import ACCESS_SUBJECT, ACTION, ENVIRONMENT, RESOURCE

CATEGORY_SHORTHANDS = {
    "AccessSubject": ACCESS_SUBJECT,
    "Resource": RESOURCE,
    "Action": ACTION,
    "Environment": ENVIRONMENT,
    "RecipientSubject": "urn:oasis:names:tc:xacml:1.0:subject-category:recipient-subject",
    "IntermediarySubject": "urn:oasis:names:tc:xacml:1.0:subject-category:intermediary-subject",
    "Codebase": "urn:oasis:names:tc:xacml:1.0:subject-category:codebase",
    "RequestingMachine": "urn:oasis:names:tc:xacml:1.0:subject-category:requesting-machine",
}

_XS = "http://www.w3.org/2001/XMLSchema#"
DATATYPE_SHORTHANDS = {
    "string": _XS + "string",
    "boolean": _XS + "boolean",
    "integer": _XS + "integer",
    "double": _XS + "double",
    "time": _XS + "time",
    "date": _XS + "date",
    "dateTime": _XS + "dateTime",
    "dayTimeDuration": _XS + "dayTimeDuration",
    "yearMonthDuration": _XS + "yearMonthDuration",
    "anyURI": _XS + "anyURI",
    "hexBinary": _XS + "hexBinary",
    "base64Binary": _XS + "base64Binary",
    "rfc822Name": "urn:oasis:names:tc:xacml:1.0:data-type:rfc822Name",
    "x500Name": "urn:oasis:names:tc:xacml:1.0:data-type:x500Name",
    "ipAddress": "urn:oasis:names:tc:xacml:2.0:data-type:ipAddress",
    "dnsName": "urn:oasis:names:tc:xacml:2.0:data-type:dnsName",
    "xpathExpression": "urn:oasis:names:tc:xacml:3.0:data-type:xpathExpression",
}
STRING = DATATYPE_SHORTHANDS["string"]

# Repeated categories multiply: 10 instances of each of 4 categories would be 10,000 decisions.
MAX_INDIVIDUAL_DECISIONS = 1000


def normalize_category(category: str) -> str:
    """Full category URI for a URI or a JSON Profile shorthand name."""
    return CATEGORY_SHORTHANDS.get(category, category)


def normalize_datatype(datatype: str) -> str:
    return DATATYPE_SHORTHANDS.get(datatype, datatype)


class UnsupportedRequestError(RequestSyntaxError):
    """A well-formed request that asks for a feature this PDP refuses (answered
    processing-error)."""

    status_code = STATUS_PROCESSING_ERROR


class RequestAttribute(NamedTuple):
    """One Attribute of one category; values are lexical, all of one datatype."""

    attribute_id: str
    datatype: str
    values: tuple[str, ...]
    issuer: str | None = None
    include_in_result: bool = False


class CategoryInstance:
    """One `Attributes` element (or JSON Category object) of the request; build with `build`.

    `bags` maps (attribute_id, datatype) and (attribute_id, datatype, issuer) to parsed values.
    """

    __slots__ = ("category", "attributes", "content", "xml_id", "bags", "included_result")

    def __init__(self, category: str, attributes: tuple[RequestAttribute, ...], content: Any,
                 xml_id: str | None, bags: dict[tuple[str, ...], tuple[Any, ...]],
                 included_result: ResultCategory | None) -> None:
        self.category = category
        self.attributes = attributes
        self.content = content
        self.xml_id = xml_id
        self.bags = bags
        self.included_result = included_result

    def __repr__(self) -> str:
        return f"CategoryInstance({self.category!r}, {self.attributes!r})"

    @classmethod
    def build(cls, category: str, attributes: Sequence[RequestAttribute], content: Any = None,
              xml_id: str | None = None, where: str = "") -> CategoryInstance:
        bags: dict[tuple[str, ...], tuple[Any, ...]] = {}
        known = datatypes.DATATYPES
        canonical = datatypes.canonical_datatype_id
        included = []
        for attr in attributes:
            dt = known.get(attr.datatype)
            if dt is None:
                parsed = tuple(attr.values)  # unknown datatype: no policy can designate it anyway
            else:
                try:
                    values = attr.values
                    parsed = (dt.parse(values[0]),) if len(values) == 1 else \
                        tuple([dt.parse(v) for v in values])
                except ValueSyntaxError as exc:
                    raise RequestSyntaxError(
                        f"invalid {attr.datatype} value for attribute {attr.attribute_id} in "
                        f"category {category}{where}: {exc}") from None
            dt_key = canonical(attr.datatype)
            key = (attr.attribute_id, dt_key)
            prev = bags.get(key)
            bags[key] = parsed if prev is None else prev + parsed
            if attr.issuer is not None:
                ikey = (attr.attribute_id, dt_key, attr.issuer)
                bags[ikey] = bags.get(ikey, ()) + parsed
            if attr.include_in_result:
                included.append(ResultAttribute(attr.attribute_id, attr.datatype, attr.values,
                                                attr.issuer))
        result = ResultCategory(category, tuple(included), xml_id) if included else None
        return cls(category, tuple(attributes), content, xml_id, bags, result)

    def included(self) -> ResultCategory | None:
        """The attributes to echo in the Result (IncludeInResult=true), or None."""
        return self.included_result


class Individual:
    """One individual decision request: at most one instance per category (after MDP expansion).

    `bags` maps (category, attribute_id, datatype[, issuer]) to the tuple of parsed values; it is
    the only thing attribute designators look at during evaluation.
    """

    __slots__ = ("instances", "bags", "return_policy_id_list", "content_by_category")

    def __init__(self, instances: Sequence[CategoryInstance], return_policy_id_list: bool) -> None:
        self.instances = tuple(instances)
        bags: dict[tuple[str, ...], tuple[Any, ...]] = {}
        for inst in self.instances:
            cat = inst.category
            for key, values in inst.bags.items():
                bags[(cat,) + key] = values
        self.bags = bags
        self.return_policy_id_list = return_policy_id_list
        self.content_by_category = {i.category: i.content for i in self.instances
                                    if i.content is not None}

    def included_attributes(self) -> tuple[ResultCategory, ...]:
        out = []
        for inst in self.instances:
            inc = inst.included()
            if inc is not None:
                out.append(inc)
        return tuple(out)


class RequestContext:
    """A parsed request: category instances in request order plus the request-level flags."""

    __slots__ = ("instances", "return_policy_id_list", "combined_decision", "_individuals")

    def __init__(self, instances: Sequence[CategoryInstance], return_policy_id_list: bool = False,
                 combined_decision: bool = False) -> None:
        self.instances = tuple(instances)
        self.return_policy_id_list = return_policy_id_list
        self.combined_decision = combined_decision
        self._individuals: tuple[Individual, ...] | None = None
        counts: dict[str, int] = {}
        for inst in self.instances:
            counts[inst.category] = counts.get(inst.category, 0) + 1
        total = 1
        for n in counts.values():
            total *= n
        if total > MAX_INDIVIDUAL_DECISIONS:
            raise UnsupportedRequestError(
                f"the repeated categories ask for {total} individual decisions; at most "
                f"{MAX_INDIVIDUAL_DECISIONS} are allowed in one request")

    @property
    def categories(self) -> tuple[str, ...]:
        """Distinct category URIs, in request order."""
        seen: dict[str, None] = {}
        for inst in self.instances:
            seen.setdefault(inst.category, None)
        return tuple(seen)

    def values(self, category: str, attribute_id: str) -> list[str]:
        """Lexical values of an attribute over every instance of the category (any datatype)."""
        category = normalize_category(category)
        out: list[str] = []
        for inst in self.instances:
            if inst.category == category:
                for attr in inst.attributes:
                    if attr.attribute_id == attribute_id:
                        out.extend(attr.values)
        return out

    def content(self, category: str) -> Any | None:
        category = normalize_category(category)
        for inst in self.instances:
            if inst.category == category and inst.content is not None:
                return inst.content
        return None

    def with_attribute(self, category: str, attribute_id: str, datatype: str,
                       values: Sequence[str]) -> RequestContext:
        """A copy where the attribute is replaced (or added) in every instance of the category.

        The PEP uses this to bind the authenticated subject: whatever the request claimed for
        that attribute is dropped, under any datatype or issuer.
        """
        category = normalize_category(category)
        datatype = normalize_datatype(datatype)
        new_attr = RequestAttribute(attribute_id, datatype, tuple(values))
        instances = []
        found = False
        for inst in self.instances:
            if inst.category == category:
                found = True
                attrs = [a for a in inst.attributes if a.attribute_id != attribute_id]
                attrs.append(new_attr)
                inst = CategoryInstance.build(category, attrs, inst.content, inst.xml_id)
            instances.append(inst)
        if not found:
            instances.append(CategoryInstance.build(category, [new_attr]))
        return RequestContext(instances, self.return_policy_id_list, self.combined_decision)

    def individuals(self) -> tuple[Individual, ...]:
        """Individual decision requests (Multiple Decision Profile, repeated categories)."""
        if self._individuals is None:
            groups: dict[str, list[CategoryInstance]] = {}
            for inst in self.instances:
                groups.setdefault(inst.category, []).append(inst)
            if all(len(g) == 1 for g in groups.values()):
                self._individuals = (Individual(self.instances, self.return_policy_id_list),)
            else:
                self._individuals = tuple(
                    Individual(combo, self.return_policy_id_list)
                    for combo in itertools.product(*groups.values()))
        return self._individuals


def iter_individuals(requests: Iterable[RequestContext]) -> Iterable[Individual]:
    for r in requests:
        yield from r.individuals()

