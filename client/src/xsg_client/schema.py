"""A handle's schema: the columns of its rows and their types, and typed values from the wire.

The gateway writes a row as one JSON object (`pep/runtime/base/encode.py`): a double always with a
fraction or an exponent (`1.0`, `3e+20`), so JSON gives a float; a long as an integer, which
Python's `json` reads exactly, whatever its size; booleans and null as JSON has them; a
timestamp as text, `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC, six fractional digits). So JSON alone
types every value but the timestamps, which only the schema tells from strings.

The gateway's answer to `POST /requests` (and a handle's description) carries the plan, not the
types of its outputs. The schema is therefore derived here from the plan and the types of the
stream's attributes (`GET /streams/<name>`), by the rules the gateway's runtime follows
(`pep/core/outputs.py`, `pep/runtime/windows/pane_windows.py`, `pep/runtime/windows/noise.py`):
- a plain plan outputs its projection, each attribute with its type (a label as its text; a
  hashed attribute as text, every other mask keeps the type);
- a windowed one `window_start` and `window_end` (tuple windows: the indices of the first and
  last tuple, longs; time windows: in the time attribute's form), its group-by keys, then its
  aggregates: `count` a long, `avg` a double, `lub` a label's text, the others the attribute's
  type;
- a join both sides' outputs as `<stream>.<output>`, then `label` when it labels its rows;
- a union its members' outputs, each name once.
A column the rules cannot type (a stream whose schema the caller may not read) is `json`: its
values stay as JSON gives them. The caller can always say better (`types=`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from xsg_client.errors import SchemaError

# The types a column may have: the gateway's attribute types (a label is its text) and `json`
# for a column whose type is not known (values as JSON gives them).
COLUMN_TYPES = ("double", "long", "string", "boolean", "timestamp", "json")
_ATTRIBUTE_TYPES = {"double": "double", "long": "long", "string": "string", "boolean": "boolean",
                    "timestamp": "timestamp", "label": "string"}
_NUMERIC = ("double", "long")


@dataclass(frozen=True)
class Column:
    """One column of a handle's rows: its name as the row's key, and its type (`COLUMN_TYPES`)."""

    name: str
    type: str

    def __post_init__(self) -> None:
        if self.type not in COLUMN_TYPES:
            raise SchemaError(f"column {self.name!r}: unknown type {self.type!r} "
                              f"(one of {', '.join(COLUMN_TYPES)})")


@dataclass(frozen=True)
class HandleSchema:
    """The columns of a handle's rows, in the order the gateway writes them."""

    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def timestamps(self) -> tuple[str, ...]:
        """The columns whose values are converted from the gateway's text to datetimes."""
        return tuple(c.name for c in self.columns if c.type == "timestamp")

    def type_of(self, name: str) -> str:
        for column in self.columns:
            if column.name == name:
                return column.type
        return "json"

    def with_types(self, types: Mapping[str, str]) -> HandleSchema:
        """This schema with the columns named in `types` given those types (a name that is not
        a column is added at the end)."""
        columns = [Column(c.name, types.get(c.name, c.type)) for c in self.columns]
        known = set(self.names)
        columns += [Column(n, t) for n, t in types.items() if n not in known]
        return HandleSchema(tuple(columns))

    def to_json(self) -> list[dict[str, str]]:
        return [{"name": c.name, "type": c.type} for c in self.columns]

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> HandleSchema:
        return cls(tuple(Column(n, t) for n, t in pairs))


# -- values ----------------------------------------------------------------------------------------

def parse_timestamp(text: str) -> datetime:
    """The gateway's timestamp text as an aware UTC datetime, to the microsecond."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise SchemaError(f"not a timestamp: {text!r}") from None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def format_timestamp(value: datetime) -> str:
    """A datetime as the gateway writes timestamps: `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def typed_row(row: dict[str, Any], timestamps: tuple[str, ...]) -> dict[str, Any]:
    """`row` (as JSON gave it) with its timestamp columns as datetimes; in place."""
    for name in timestamps:
        value = row.get(name)
        if isinstance(value, str):
            row[name] = parse_timestamp(value)
    return row


def wire_value(value: Any) -> Any:
    """A typed value back in the form the gateway wrote it (a datetime as its text)."""
    return format_timestamp(value) if isinstance(value, datetime) else value


# -- from a plan -----------------------------------------------------------------------------------

AttributeTypes = Mapping[str, Mapping[str, str]]  # stream -> attribute -> the gateway's type


def stream_types(stream: Mapping[str, Any]) -> dict[str, str]:
    """A stream's attribute types from its description (`GET /streams/<name>`)."""
    return {str(f["name"]): str(f["type"]) for f in stream.get("schema") or ()
            if isinstance(f, Mapping) and "name" in f and "type" in f}


def plan_streams(plan: Mapping[str, Any]) -> tuple[str, ...]:
    """Every stream a plan reads (a join's two, else its one)."""
    join = plan.get("join")
    if isinstance(join, Mapping):
        return tuple(str(join[side]["stream"]) for side in ("left", "right"))
    return (str(plan["stream"]),) if plan.get("stream") else ()


def schema_from_plan(plan: Mapping[str, Any], types: AttributeTypes) -> HandleSchema:
    """The columns of a handle with this plan (the `plan` of `POST /requests`' answer or of a
    handle's description), given the attribute types of its streams (see the module
    docstring)."""
    join = plan.get("join")
    if isinstance(join, Mapping):
        pairs: list[tuple[str, str]] = []
        for side in ("left", "right"):
            side_plan = join[side]
            stream = str(side_plan["stream"])
            pairs += [(f"{stream}.{name}", kind)
                      for name, kind in _side_columns(side_plan, types.get(stream, {}))]
        if isinstance(join.get("label"), Mapping):
            pairs.append((str(join["label"].get("output", "label")), "string"))
        return _in_output_order(pairs, plan.get("output"))
    members = plan.get("union")
    stream_attrs = types.get(str(plan.get("stream")), {})
    if isinstance(members, list):
        seen: dict[str, str] = {}
        for member in members:
            for name, kind in _side_columns(member, stream_attrs):
                seen.setdefault(name, kind)
        return HandleSchema.of(seen.items())
    return _in_output_order(_side_columns(plan, stream_attrs), None)


def _in_output_order(pairs: list[tuple[str, str]], output: Any) -> HandleSchema:
    """The derived columns, in the order of the plan's `output` when it names them all."""
    found = dict(pairs)
    if isinstance(output, list) and set(map(str, output)) == set(found):
        return HandleSchema.of((str(n), found[str(n)]) for n in output)
    return HandleSchema.of(pairs)


def _side_columns(plan: Mapping[str, Any], attributes: Mapping[str, str]
                  ) -> list[tuple[str, str]]:
    """A single stream's plan: its outputs and their types."""
    masks = plan.get("masks") or {}

    def type_of(attribute: str) -> str:
        kind = _ATTRIBUTE_TYPES.get(attributes.get(attribute, ""), "json")
        mask = masks.get(attribute) if isinstance(masks, Mapping) else None
        if isinstance(mask, str) and mask.split(":", 1)[0].strip().lower() == "hash":
            return "string"  # a hashed value is text; every other mask keeps the type
        return kind

    window = plan.get("window")
    if not isinstance(window, Mapping):
        return [(str(a), type_of(str(a))) for a in plan.get("projection") or ()]
    if window.get("type") == "tuple":
        bound = "long"  # the indices of the window's first and last tuple
    else:
        time_type = type_of(str(window.get("time_attribute")))
        bound = time_type if time_type in _NUMERIC else "timestamp"
    columns = [("window_start", bound), ("window_end", bound)]
    columns += [(str(k), type_of(str(k))) for k in window.get("keys") or ()]
    for aggregate in window.get("aggregates") or ():
        function = aggregate.get("function")
        kind = ("long" if function == "count" else "double" if function == "avg"
                else "string" if function == "lub" else type_of(str(aggregate.get("attribute"))))
        columns.append((str(aggregate.get("output")), kind))
    return columns


__all__ = ["COLUMN_TYPES", "Column", "HandleSchema", "parse_timestamp", "format_timestamp",
           "typed_row", "wire_value", "stream_types", "plan_streams", "schema_from_plan",
           "AttributeTypes"]
