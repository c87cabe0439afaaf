"""Masks: an attribute shown in a coarser or keyed-hash form instead of raw or hidden.

An owner's `exacml:obligation:stream-mask` (also `pCloud:obligation:stream-mask`) lists masks,
one per `stream-mask-attribute-id` value, written `attribute:mask`:

    speed:round:5           a number rounded down to a multiple of 5
    lat,lon:grid:0.1        a position: both coordinates rounded down to the 0.1 degree grid
    ts:truncate:minute      a timestamp truncated to the minute (second, minute, hour, day; UTC)
    speed:bands:0,10,20     a number replaced by the lower edge of its band ([0, 10) -> 0,
                            [10, 20) -> 10, [20, inf) -> 20; below the first edge: null)
    shipname:prefix:3       the first 3 characters of a string (suffix:3: the last 3)
    mmsi:hash               a keyed hash (HMAC-SHA-256, hex) with the stream owner's secret
    shipname:null           the attribute is kept, its value is always null

Every rounding is downwards (floor), so a coarser mask is a function of a finer one: `round:10`
is coarser than `round:5` (10 is a multiple of 5), `grid:1` than `round:0.1`, `bands:0,10,20`
than `round:5` (every edge a multiple of 5) and than `bands:0,5,10,15,20` (a subset of the
edges), `truncate:hour` than `truncate:minute`, `prefix:2` than `prefix:3`, `null` than
anything. Masks that are not so ordered (`round:4` and `round:6`, `hash` and `prefix:3`,
`prefix` and `suffix`) cannot be composed: a request to which both apply is denied.

Which mask fits which type (anything else: deny): double: round, grid (a pair), bands, null;
long: round (integer step), bands (integer edges), hash, null; string: hash, prefix, suffix,
null; timestamp: truncate, null; boolean: null. A hash of a long hashes its decimal text.

This module is pure: the vocabulary, its order, the view a consumer gets (`view_schema`), the
merge of the policy's masks with the consumer's own (`plan_masks`, called from
`pep.core.merge`), what the NR/PR analysis may infer about a raw value from a comparison on its
masked value, and the SQL-like text. The runtime computes masks as Spark column expressions
(`pep.runtime.privacy.masks`).

The parts, one module each: `vocabulary` (the kinds, their parameters and types, the text),
`order` (which is coarser, composing, the consumer's view), `merging` (with a consumer's own
masks, for the merge and the analysis). Callers import the names below from `pep.core.masks`.
"""
from __future__ import annotations

from pep.core.masks.merging import (
                                       MaskPlan,
                                       filter_notes,
                                       output_masks,
                                       plan_dnf,
                                       plan_masks,
                                       policy_masks,
                                       split_variable,
                                       variable,
                                       window_masks,
)
from pep.core.masks.order import (
                                       at_least_as_coarse,
                                       compose,
                                       compose_all,
                                       masks_of,
                                       ordered,
                                       view_schema,
)
from pep.core.masks.vocabulary import (
                                       KINDS,
                                       KINDS_FOR_TYPE,
                                       MAX_BANDS,
                                       MAX_DIGITS,
                                       MAX_LENGTH,
                                       STEP_KINDS,
                                       UNIT_MICROS,
                                       UNORDERED,
                                       Mask,
                                       MaskError,
                                       MaskRefused,
                                       check_fits,
                                       decimal_text,
                                       describe,
                                       mask_sql,
                                       masks_json,
                                       parse_assignment,
                                       parse_mask,
)

__all__ = ["Mask", "MaskError", "MaskRefused", "MaskPlan", "KINDS", "UNIT_MICROS", "parse_mask",
           "parse_assignment", "check_fits", "at_least_as_coarse", "compose", "compose_all",
           "ordered", "masks_of", "view_schema", "variable", "split_variable", "plan_masks",
           "plan_dnf", "filter_notes", "window_masks", "output_masks", "mask_sql", "masks_json",
           "describe", "decimal_text", "STEP_KINDS", "KINDS_FOR_TYPE", "MAX_BANDS", "MAX_LENGTH",
           "MAX_DIGITS", "policy_masks", "UNORDERED"]
