"""Joins of two streams: one Structured Streaming query per distinct join (`runtime.py`) over the
joined DataFrame of its two sides (`frames.py`). No Spark import here: import the modules."""
