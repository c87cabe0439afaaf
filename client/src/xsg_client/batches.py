"""Rows as Arrow record batches and pandas DataFrames, typed by the handle's schema.

Needs pyarrow (the `arrow` extra) and, for DataFrames, pandas (the `pandas` extra). Types:
double -> float64, long -> int64, string -> string, boolean -> bool, timestamp ->
timestamp[us, UTC] (the gateway's precision), json (a column the schema could not type) ->
what Arrow infers from the values, else their JSON text. A row key the schema does not name is
added as a `json` column rather than dropped. In pandas, longs become the nullable `Int64`
(a null in an int64 column would otherwise turn it into float64 and round values past 2**53)
and booleans the nullable `boolean`.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from xsg_client.errors import SchemaError
from xsg_client.schema import HandleSchema

if TYPE_CHECKING:
    import pandas
    import pyarrow


def arrow_type(kind: str) -> pyarrow.DataType | None:
    """The Arrow type of a column type (None for `json`: inferred from the values)."""
    import pyarrow as pa

    return {"double": pa.float64(), "long": pa.int64(), "string": pa.string(),
            "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC")}.get(kind)


def to_record_batch(rows: Sequence[dict[str, Any]], schema: HandleSchema,
                    ids: Sequence[int] | None = None,
                    id_column: str | None = None) -> pyarrow.RecordBatch:
    """`rows` (typed dicts, as a handle stream gives them) as one record batch, the columns in
    the schema's order; `id_column` (with `ids`): the rows' event ids first, as int64."""
    import pyarrow as pa

    names = list(schema.names)
    known = set(names)
    for row in rows:
        for key in row:
            if key not in known:
                known.add(key)
                names.append(key)
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    if id_column is not None:
        if ids is None or len(ids) != len(rows):
            raise ValueError("id_column needs one event id per row")
        arrays.append(pa.array(ids, pa.int64()))
        fields.append(pa.field(id_column, pa.int64(), nullable=False))
    for name in names:
        values = [row.get(name) for row in rows]
        kind = schema.type_of(name)
        wanted = arrow_type(kind)
        try:
            array = pa.array(values, wanted) if wanted is not None else _inferred(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise SchemaError(f"column {name!r} ({kind}): {exc}") from None
        arrays.append(array)
        fields.append(pa.field(name, array.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _inferred(values: list[Any]) -> pyarrow.Array:
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


def to_pandas(batch: pyarrow.RecordBatch) -> pandas.DataFrame:
    """A record batch as a DataFrame, with exact nullable integers and booleans."""
    import pandas as pd
    import pyarrow as pa

    mapping = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    frame: pd.DataFrame = batch.to_pandas(types_mapper=mapping.get)
    return frame


__all__ = ["arrow_type", "to_record_batch", "to_pandas"]
