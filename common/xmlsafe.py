"""Hardened loading of untrusted XML and JSON documents.

Policies and requests come from the network, so the parsers here refuse everything that has been
used to attack XML processors: DTDs (and with them entity bombs and external entities), network
access, oversized documents and pathological nesting. JSON gets the same size and depth limits,
because Python's json module recurses and a deeply nested array is a cheap way to crash it.

Callers turn `UnsafeDocumentError` into their own error type (PolicyLoadError for policies,
RequestSyntaxError for requests); the message already says what went wrong and where.
"""
from __future__ import annotations

import json
import threading
from typing import Any

from lxml import etree

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_DEPTH = 100

# Process-wide limits used when a caller passes none (configurable with `set_limits`).
_limits = {"max_bytes": DEFAULT_MAX_BYTES, "max_depth": DEFAULT_MAX_DEPTH}


def set_limits(max_bytes: int | None = None, max_depth: int | None = None) -> None:
    """Change the default size (bytes) and nesting (levels) limits for every later parse."""
    if max_bytes is not None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        _limits["max_bytes"] = max_bytes
    if max_depth is not None:
        if max_depth <= 0:
            raise ValueError("max_depth must be positive")
        _limits["max_depth"] = max_depth


def get_limits() -> tuple[int, int]:
    """(max_bytes, max_depth) currently applied by default."""
    return _limits["max_bytes"], _limits["max_depth"]


class UnsafeDocumentError(ValueError):
    """The document is malformed or breaks one of the safety limits."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.message = message
        self.line = line
        super().__init__(f"{message} (line {line})" if line else message)


def _make_parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
        collect_ids=False,
    )


# An lxml parser must not be shared between threads; one per thread is cheap and reused.
_local = threading.local()


def _parser() -> etree.XMLParser:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = _make_parser()
    return parser


def _has_doctype(data: bytes) -> bool:
    # Cheap pre-scan before parsing at all. UTF-16/32 documents are decoded first so that the
    # check cannot be dodged by an encoding change; lxml checks again after parsing.
    head = data
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[:4] in (
        b"\x00\x00\xfe\xff",
        b"\xff\xfe\x00\x00",
    ):
        try:
            head = data.decode(
                "utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-32"
            ).encode("utf-8")
        except UnicodeDecodeError:
            return False
    return b"<!DOCTYPE" in head or b"<!ENTITY" in head


def parse_xml(data: bytes, *, max_bytes: int | None = None,
              max_depth: int | None = None) -> etree._Element:
    """Parse untrusted XML into an lxml element, refusing DTDs, huge and deeply nested documents."""
    max_bytes = _limits["max_bytes"] if max_bytes is None else max_bytes
    max_depth = _limits["max_depth"] if max_depth is None else max_depth
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > max_bytes:
        raise UnsafeDocumentError(
            f"XML document is {len(data)} bytes, over the limit of {max_bytes} bytes")
    if not data.strip():
        raise UnsafeDocumentError("XML document is empty")
    if _has_doctype(data):
        raise UnsafeDocumentError(
            "XML document contains a DOCTYPE/ENTITY declaration, which is refused"
        )
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        line = exc.lineno if exc.lineno else None
        msg = exc.msg or str(exc)
        raise UnsafeDocumentError(f"malformed XML: {msg}", line) from None
    except ValueError as exc:  # e.g. unicode strings with encoding declaration
        raise UnsafeDocumentError(f"malformed XML: {exc}") from None
    docinfo = root.getroottree().docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:
        raise UnsafeDocumentError("XML document contains a DOCTYPE declaration, which is refused")
    # Every element needs a '<' (a 0x3C byte in any supported encoding), so a document with at
    # most max_depth of them cannot nest deeper: small requests skip the walk.
    if data.count(b"<") > max_depth:
        _check_depth(root, max_depth)
    return root


def _check_depth(root: etree._Element, max_depth: int) -> None:
    stack = [(root, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        elem, depth = pop()
        if depth > max_depth:
            raise UnsafeDocumentError(
                f"XML document nests deeper than {max_depth} elements", elem.sourceline)
        for child in elem:
            push((child, depth + 1))


def parse_json(data: bytes | str, *, max_bytes: int | None = None,
               max_depth: int | None = None) -> Any:
    """Parse untrusted JSON with the same size and depth limits as XML."""
    max_bytes = _limits["max_bytes"] if max_bytes is None else max_bytes
    max_depth = _limits["max_depth"] if max_depth is None else max_depth
    if isinstance(data, (bytes, bytearray)):
        if len(data) > max_bytes:
            raise UnsafeDocumentError(
                f"JSON document is {len(data)} bytes, over the limit of {max_bytes} bytes")
        try:
            text = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UnsafeDocumentError(f"JSON document is not valid UTF-8: {exc}") from None
    else:
        text = data
        if len(text.encode("utf-8")) > max_bytes:
            raise UnsafeDocumentError(f"JSON document is over the limit of {max_bytes} bytes")
    too_deep = json_too_deep(text, max_depth)
    if too_deep is not None:
        raise UnsafeDocumentError(f"JSON document nests deeper than {max_depth} levels", too_deep)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnsafeDocumentError(
            f"malformed JSON: {exc.msg} at column {exc.colno}", exc.lineno) from None
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise UnsafeDocumentError(f"invalid JSON: {exc}") from None
    except RecursionError:  # pragma: no cover - the depth pre-check prevents it
        raise UnsafeDocumentError("JSON document nests too deeply") from None


def json_too_deep(text: str, max_depth: int) -> int | None:
    """The line on which a JSON text's bracket nesting (outside strings) first goes deeper than
    `max_depth`, or None: counted before a recursive parser (Python's json) sees the text."""
    if text.count("[") + text.count("{") <= max_depth:
        return None
    depth = 0
    in_string = False
    escaped = False
    line = 1
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return line
        elif ch in "]}":
            depth -= 1
        elif ch == "\n":
            line += 1
    return None
