"""The JSON form of a consumer's query (the package docstring has it), checked key by key;
errors name the JSON path ("$.window.size")."""
from __future__ import annotations

import json
from dataclasses import replace

from pep.core.jsontypes import JsonValue
from pep.core.obligations import parse_window_kind, parse_window_number
from pep.core.privacy import parse_delta, parse_epsilon
from pep.core.userquery.model import (
    MAX_QUERY_BYTES,
    MAX_QUERY_DEPTH,
    PRIVACY_KEYS,
    JoinQuery,
    UserQuery,
    UserQueryError,
    WindowPrivacy,
    privacy_ask,
    within_seconds,
)

_JSON_KEYS = {"stream", "filter", "map", "mask", "window", "join"}
_JSON_JOIN_KEYS = {"stream", "on", "within", "filter", "map", "mask", "window"}
_JSON_WINDOW_KEYS = {"type", "size", "step", "aggregates", "keys", "min_count", "coarsen",
                     "epsilon", "delta"}


def parse_json_query(data: bytes | str) -> UserQuery:
    if isinstance(data, (bytes, bytearray)):
        if len(data) > MAX_QUERY_BYTES:
            raise UserQueryError(
                f"user query is {len(data)} bytes, over the limit of {MAX_QUERY_BYTES}")
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UserQueryError(f"user query is not UTF-8: {exc}") from None
    if len(data) > MAX_QUERY_BYTES:
        raise UserQueryError(f"user query is over the limit of {MAX_QUERY_BYTES} bytes")
    if data.count("[") + data.count("{") > 4 * MAX_QUERY_DEPTH + 200:
        raise UserQueryError("user query JSON has too many nested values")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise UserQueryError(f"malformed user query JSON: {exc.msg}",
                             f"line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:  # an integer over Python's 4300-digit conversion limit
        raise UserQueryError(f"malformed user query JSON: {str(exc)[:120]}") from None
    except RecursionError:
        raise UserQueryError("user query JSON nests too deeply") from None
    return query_from_json(doc)


def query_from_json(doc: JsonValue, path: str = "$", in_join: bool = False) -> UserQuery:
    """The JSON form from an already decoded value (for example the JSON request's Content).
    With `in_join`, `doc` is a query's `join` object and this reads the second side's parts."""
    if not in_join and isinstance(doc, dict) and set(doc) == {"UserQuery"}:
        doc, path = doc["UserQuery"], "$.UserQuery"
    if not isinstance(doc, dict):
        raise UserQueryError(
            f"a user query must be a JSON object, found {type(doc).__name__}", path
        )
    allowed = _JSON_JOIN_KEYS if in_join else _JSON_KEYS
    unknown = sorted(set(doc) - allowed)
    if unknown:
        if in_join and "join" in unknown:
            raise UserQueryError("a join cannot hold another join: a join joins exactly two "
                                 "streams", f"{path}.join")
        raise UserQueryError(f"unknown key(s) {', '.join(map(repr, unknown))}; expected "
                             f"{', '.join(sorted(allowed))}", path)
    stream = doc.get("stream")
    if stream is not None and (not isinstance(stream, str) or not stream.strip()):
        raise UserQueryError("'stream' must be a non-empty string", f"{path}.stream")
    filt = doc.get("filter")
    if filt is not None and (not isinstance(filt, str) or not filt.strip()):
        raise UserQueryError("'filter' must be a non-empty condition string", f"{path}.filter")
    attrs = doc.get("map")
    if attrs is not None:
        if not isinstance(attrs, list) or not attrs or not all(isinstance(a, str) for a in attrs):
            raise UserQueryError("'map' must be a non-empty list of attribute names", f"{path}.map")
    window = doc.get("window")
    kind = size = step = None
    aggregates: list[str] = []
    keys: tuple[str, ...] | None = None
    min_count = 1
    coarsen = False
    asked: WindowPrivacy = {}
    if window is not None:
        wpath = f"{path}.window"
        if not isinstance(window, dict):
            raise UserQueryError("'window' must be an object", wpath)
        unknown = sorted(set(window) - _JSON_WINDOW_KEYS)
        if unknown:
            raise UserQueryError(f"unknown key(s) {', '.join(map(repr, unknown))}; expected "
                                 "type, size, step, aggregates, keys, min_count, coarsen, "
                                 "epsilon, delta", wpath)
        for key in ("type", "size", "step"):
            if key not in window:
                raise UserQueryError(f"window needs '{key}'", wpath)
        if not isinstance(window["type"], str):
            raise UserQueryError("window type must be 'tuple' or 'time'", f"{wpath}.type")
        try:
            kind = parse_window_kind(window["type"])
        except ValueError as exc:
            raise UserQueryError(str(exc), f"{wpath}.type") from None
        for key in ("size", "step"):
            value = window[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserQueryError(f"window {key} must be a positive integer", f"{wpath}.{key}")
            try:
                parse_window_number(str(value), key)
            except ValueError as exc:
                raise UserQueryError(str(exc), f"{wpath}.{key}") from None
        size, step = window["size"], window["step"]
        raw = window.get("aggregates", [])
        if not isinstance(raw, list):
            raise UserQueryError("'aggregates' must be a list", f"{wpath}.aggregates")
        for i, item in enumerate(raw):
            if isinstance(item, str):
                aggregates.append(item)
            elif (isinstance(item, dict) and set(item) == {"attribute", "function"}
                  and all(isinstance(v, str) for v in item.values())):
                aggregates.append(f"{item['attribute']}:{item['function']}")
            else:
                raise UserQueryError("an aggregate is \"attribute:function\" or "
                                     "{\"attribute\": ..., \"function\": ...}",
                                     f"{wpath}.aggregates[{i}]")
        if "keys" in window:
            raw_keys = window["keys"]
            if not isinstance(raw_keys, list) or not all(isinstance(k, str) for k in raw_keys):
                raise UserQueryError("'keys' must be a list of attribute names", f"{wpath}.keys")
            keys = tuple(raw_keys)
        if "min_count" in window:
            value = window["min_count"]
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserQueryError("min_count must be a positive integer", f"{wpath}.min_count")
            try:
                min_count = parse_window_number(str(value), "minimum count")
            except ValueError as exc:
                raise UserQueryError(str(exc), f"{wpath}.min_count") from None
        if "coarsen" in window:
            if not isinstance(window["coarsen"], bool):
                raise UserQueryError("coarsen must be true or false", f"{wpath}.coarsen")
            coarsen = window["coarsen"]
        for key in PRIVACY_KEYS:
            if key not in window:
                continue
            value = window[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UserQueryError(f"{key} must be a number", f"{wpath}.{key}")
            try:
                asked[key] = (parse_epsilon(repr(float(value))) if key == "epsilon"
                              else parse_delta(repr(float(value))))
            except (ValueError, OverflowError) as exc:
                raise UserQueryError(str(exc), f"{wpath}.{key}") from None
    join = _json_join(doc["join"], f"{path}.join") if "join" in doc else None
    masks = _json_masks(doc["mask"], f"{path}.mask") if doc.get("mask") is not None else ()
    return UserQuery(stream, filt.strip() if filt else None,
                     tuple(attrs) if attrs is not None else None, kind, size, step,
                     tuple(aggregates), window is not None, f"{path}.filter", keys, min_count,
                     coarsen, join, privacy_ask(asked), masks)


def _json_masks(value: JsonValue, path: str) -> tuple[str, ...]:
    """`{"speed": "round:10", "lat,lon": "grid:1"}` or `["speed:round:10", ...]` as
    "attribute:mask" texts."""
    if isinstance(value, dict):
        out = []
        for name, spec in value.items():
            if not isinstance(spec, str) or not spec.strip() or not name.strip():
                raise UserQueryError("each mask is \"attribute\": \"mask\" (\"speed\": "
                                     "\"round:10\")", f"{path}.{name}")
            out.append(f"{name}:{spec}")
        return tuple(out)
    if isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(value)
    raise UserQueryError("'mask' must be an object attribute -> mask ({\"speed\": "
                         "\"round:10\"}) or a list of \"attribute:mask\" texts", path)


def _json_join(doc: JsonValue, path: str) -> JoinQuery:
    if not isinstance(doc, dict):
        raise UserQueryError("'join' must be an object", path)
    if not isinstance(doc.get("stream"), str) or not doc["stream"].strip():
        raise UserQueryError("a join needs 'stream': the name of the stream to join",
                             f"{path}.stream")
    raw_on = doc.get("on")
    if not isinstance(raw_on, list) or not raw_on:
        raise UserQueryError("a join needs 'on': a non-empty list of [left attribute, right "
                             "attribute] pairs", f"{path}.on")
    on = []
    for i, pair in enumerate(raw_on):
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(a, str) and a.strip() for a in pair)):
            raise UserQueryError("each 'on' item is a pair [left attribute, right attribute]",
                                 f"{path}.on[{i}]")
        on.append((pair[0].strip(), pair[1].strip()))
    within = (
        within_seconds(doc["within"], f"{path}.within") if doc.get("within") is not None else None
    )
    name = doc["stream"].strip()
    side = replace(query_from_json(doc, path, in_join=True), stream=name)
    return JoinQuery(name, tuple(on), within, side)
