"""`spark.readStream.format("xsg")` without registering anything: pyspark looks up the installed
modules named `pyspark_*` for a `DefaultSource` data source when a session first reads a Python
data source (`pyspark/sql/worker/lookup_data_sources.py`). The source is
`xsg_client.spark.XsgDataSource`."""
from __future__ import annotations

from xsg_client.spark import XsgDataSource as DefaultSource

__all__ = ["DefaultSource"]
