"""The order of masks (which reveals no more than which: `at_least_as_coarse`), composing
several policies' masks into the coarsest (`compose`, `compose_all`; deny when none is), and the
view of a stream's schema a consumer gets through them (`view_schema`)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from pep.core.masks.vocabulary import STEP_KINDS, Mask, MaskError, parse_mask
from pep.core.plan import Field, StreamSchema


def at_least_as_coarse(a: Mask | None, b: Mask | None) -> bool:
    """Whether `a` (None: the raw value) reveals nothing that `b` hides: a's value is a
    function of b's, for every raw value."""
    if a is None:
        return b is None
    if b is None or a.kind == "null":
        return True
    if b.kind == "null":
        return False
    if a == b:
        return True
    if a.kind in STEP_KINDS and b.kind in STEP_KINDS:
        return a.step_value % b.step_value == 0
    if a.kind == "truncate" and b.kind == "truncate":
        return a.unit_micros % b.unit_micros == 0
    if a.kind == "bands" and b.kind in STEP_KINDS:
        return all(e % b.step_value == 0 for e in a.edges)
    if a.kind == "bands" and b.kind == "bands":
        return set(a.edges) <= set(b.edges)
    if a.kind == b.kind and a.kind in ("prefix", "suffix"):
        return a.length_value <= b.length_value
    return False


def compose(a: Mask, b: Mask, attribute: str) -> Mask:
    """The coarser of two masks on one attribute; MaskError when neither is coarser."""
    if at_least_as_coarse(a, b):
        return a
    if at_least_as_coarse(b, a):
        return b
    raise MaskError(f"the masks {a.spec!r} and {b.spec!r} on attribute {attribute!r} cannot be "
                    "composed: neither is coarser than the other (a step must be a multiple of "
                    "the other, bands a subset of the other's edges or multiples of the step, a "
                    "hash or a prefix is only coarser than itself)")


def compose_all(pairs: Iterable[tuple[str, Mask]], into: dict[str, Mask] | None = None
                ) -> dict[str, Mask]:
    """Every (attribute, mask) composed per attribute; MaskError when two cannot be."""
    out = dict(into or {})
    for name, mask in pairs:
        out[name] = compose(out[name], mask, name) if name in out else mask
    return out


def ordered(masks: Mapping[str, Mask], schema: StreamSchema) -> tuple[tuple[str, str], ...]:
    """(attribute, spec) pairs in schema order: how graphs and plans hold masks."""
    return tuple((n, masks[n].spec) for n in schema.names if n in masks)


def masks_of(pairs: Iterable[tuple[str, str]]) -> dict[str, Mask]:
    return {name: parse_mask(spec) for name, spec in pairs}


def view_schema(schema: StreamSchema, masks: Mapping[str, Mask]) -> StreamSchema:
    """The schema a consumer sees: a hashed attribute is text."""
    if not any(m.kind == "hash" for m in masks.values()):
        return schema
    return StreamSchema(tuple(Field(f.name, masks[f.name].output_type(f.type))
                              if f.name in masks else f for f in schema.fields))
