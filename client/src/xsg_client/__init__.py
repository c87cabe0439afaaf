"""xsg-client: the consumer's side of an xsg gateway.

Ask for a stream (`Client.request`, or a XACML request file with `Client.request_file`), read
the handle the gateway grants (`Client.open`: rows typed by the handle's schema, events for
gaps, notices, reconnections and the end), release it (`Client.release`). `AsyncClient` does
the same under asyncio; `HandleStream.batches` / `frames` give Arrow record batches and pandas
DataFrames (extras `arrow`, `pandas`); `xsg_client.spark` is a Spark data source for handles
(extra `spark`): `spark.readStream.format("xsg").option("handle", url).load()`.

Only httpx is needed; nothing here imports Spark, pyarrow or pandas until asked to.
"""
from __future__ import annotations

from xsg_client._core import Grant, HandleInfo, HandleRef, ReadToken, handle_ref
from xsg_client.access import AccessRequest
from xsg_client.aio import AsyncClient, AsyncHandleStream
from xsg_client.client import Client, HandleStream
from xsg_client.errors import (
                               BadHandle,
                               ConnectionLost,
                               HandleEnded,
                               HTTPError,
                               SchemaError,
                               Unreachable,
                               XsgError,
)
from xsg_client.events import Disconnected, End, Event, Gap, Notice, Reconnected, Row
from xsg_client.schema import Column, HandleSchema, format_timestamp, parse_timestamp

__version__ = "0.1.0"

__all__ = ["Client", "AsyncClient", "HandleStream", "AsyncHandleStream", "AccessRequest",
           "Grant", "HandleInfo", "HandleRef", "ReadToken", "handle_ref",
           "Row", "Gap", "Notice", "Disconnected", "Reconnected", "End", "Event",
           "Column", "HandleSchema", "parse_timestamp", "format_timestamp",
           "XsgError", "BadHandle", "HTTPError", "Unreachable", "ConnectionLost", "SchemaError",
           "HandleEnded",
           "__version__"]
