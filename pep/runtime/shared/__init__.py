"""The shared query: one Structured Streaming query for a gateway process's ingest streams, one
Spark job per micro-batch for all of them (`query.py`), each stream's parts its own
(`member.py`, `branch.py`), its trigger adapting between the operator's bounds (`trigger.py`)."""
