"""Where a stream's tuples come from and where its query stands in them: the sources' streaming
DataFrames, the generators, the Kafka connector's jars and offsets, the per-stream checkpoints
and the archive's retention, and what each micro-batch of a Kafka query read. No Spark import
here: import the modules."""
