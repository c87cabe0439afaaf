"""The access request a consumer sends to `POST /requests`: built, or read from a file as is.

The gateway takes the XACML request alone (XML or JSON, by Content-Type), or `multipart/form-data`
with a part `request` and a part `query`: the consumer's own query (XML or JSON, see the
gateway's `pep/core/userquery`), each part with its own Content-Type. A built request is the
XACML JSON profile's short form: the resource-id is the stream, the action-id the action. The
subject in a request is informative only: the gateway decides for whoever the bearer token
says, whatever the request claims (a subject given here is for `xsg pdp decide`, offline).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xsg_client.errors import XsgError

SUBJECT_ID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
ACTION_ID = "urn:oasis:names:tc:xacml:1.0:action:action-id"
XML = "application/xacml+xml"
JSON = "application/xacml+json"

# A user query: its JSON form as an object, or its text (XML or JSON), as str or bytes.
Query = Mapping[str, Any] | str | bytes


@dataclass(frozen=True)
class AccessRequest:
    """A XACML request (`body`, as `media_type`) and the consumer's own query, if any."""

    body: bytes
    media_type: str
    query: bytes | None = None
    query_type: str | None = None

    @classmethod
    def for_stream(cls, stream: str, action: str = "read", subject: str | None = None,
                   query: Query | None = None) -> AccessRequest:
        """A request to `action` (`read`, `subscribe`, ...) the stream `stream`, with the
        consumer's own `query` (optional)."""
        if not isinstance(stream, str) or not stream:
            raise XsgError("a request needs the name of a stream")
        request: dict[str, Any] = {
            "Resource": {"Attribute": [{"AttributeId": RESOURCE_ID, "Value": stream}]},
            "Action": {"Attribute": [{"AttributeId": ACTION_ID, "Value": action}]},
        }
        if subject is not None:
            request["AccessSubject"] = {"Attribute": [{"AttributeId": SUBJECT_ID,
                                                       "Value": subject}]}
        body = json.dumps({"Request": request}).encode("utf-8")
        return cls(body, JSON).with_query(query)

    @classmethod
    def from_file(cls, path: str | Path, query: Query | None = None) -> AccessRequest:
        """A request file sent as it is: XML or JSON, told by its first character."""
        try:
            body = Path(path).read_bytes()
        except OSError as exc:
            raise XsgError(f"cannot read {path}: {exc.strerror or exc}") from None
        media = _sniff(body, XML, JSON)
        if media is None:
            raise XsgError(f"{path} is neither XML nor JSON (it must start with '<' or '{{')")
        return cls(body, media).with_query(query)

    def with_query(self, query: Query | None) -> AccessRequest:
        """This request with the consumer's own query beside it (None: none)."""
        if query is None:
            return AccessRequest(self.body, self.media_type)
        if isinstance(query, Mapping):
            text = json.dumps(dict(query)).encode("utf-8")
        else:
            text = query.encode("utf-8") if isinstance(query, str) else bytes(query)
        kind = _sniff(text, "application/xml", "application/json")
        if kind is None:
            raise XsgError("a query is XML (starting with '<') or JSON (starting with '{')")
        return AccessRequest(self.body, self.media_type, text, kind)

    def http_content(self) -> dict[str, Any]:
        """The keyword arguments of an httpx request that sends it."""
        if self.query is None:
            return {"content": self.body, "headers": {"Content-Type": self.media_type}}
        return {"files": {"request": ("request", self.body, self.media_type),
                          "query": ("query", self.query, self.query_type)}}


def _sniff(data: bytes, xml: str, json_type: str) -> str | None:
    head = data.lstrip()[:1]
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
        head = data[3:].lstrip()[:1]
    return xml if head == b"<" else json_type if head in (b"{", b"[") else None


__all__ = ["AccessRequest", "Query", "SUBJECT_ID", "RESOURCE_ID", "ACTION_ID"]
