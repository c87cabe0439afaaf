"""The runtime's plumbing, below every other room: the names of its own columns, the memo of
Spark expressions, Arrow to JSON texts, delivery to handles under their locks, the batch steps'
py4j calls and the foreachBatch wrapper. No Spark import here: import the modules."""
