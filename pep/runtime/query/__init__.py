"""The shared stream query: one Structured Streaming query per source stream, serving every
attached plan, built from parts that each own their state (`executor.py` wires them; the
package's README has the table). No Spark import here: import the modules."""
