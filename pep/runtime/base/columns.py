"""The names of the runtime's own columns, beside a stream's attributes (no Spark here).

Every source frame carries `SEQ_COLUMN` and `FILE_COLUMN` (`sources/frames.py`); the shared query's
jobs add the others (`query/rows_job.py`, `query/panes_job.py`, `plans/plan_expressions.py`) and
read them back from Arrow (`query/router.py`). In one low module so that sources, spatial
predicates, joins and the shared query name them alike without importing each other."""
from __future__ import annotations

SEQ_COLUMN = "_xsg_seq"    # a per-stream increasing position, when the source has one
FILE_COLUMN = "_xsg_file"  # the file (or Kafka topic/partition/offset) a tuple came from
POS_COLUMN = "_xsg_pos"    # a tuple's position in its batch (monotonically_increasing_id)
TIME_COLUMN = "_xsg_t"     # the stream's time attribute as epoch seconds (ordering)
ORDER_NUMBER = "_xsg_tn"   # ... its value as a double, for masks of it (the masked rows job)
ORDER_EXACT = "_xsg_tx"    # ... its exact value (microseconds, a long), for masks of it
NUMS_COLUMN = "_xsg_n"     # per-row array of every attribute as a double
STRS_COLUMN = "_xsg_s"     # ... as text
LNGS_COLUMN = "_xsg_l"     # ... as a 64-bit integer (exact longs, timestamps, booleans)
KEYS_COLUMN = "_xsg_k"     # per-row array of the group-by attributes' JSON texts
PLANS_COLUMN = "_xsg_plans"  # the plan table's array of plan structs, on every row
PIDS_COLUMN = "_xsg_pids"  # the ids of the plans a row passed
BITS_COLUMN = "_xsg_pbits"  # the grouped matcher's bitmap of a row's plans (plans/matcher.py)
READ_COLUMN = "_xsg_read"  # tuples a grouped-matcher task read (its figures row; else null)
TOP_COLUMN = "_xsg_top"  # ... and the highest position among them
HASHED_PREFIX = "_xsg_h_"  # a hashed long attribute's text in the rows job's output
EMIT = "_xsg_e"  # the rows job's emission (with masks): the plan ids a row is for, their masks
PLAN = "p"  # the panes job's exploded plan struct
# A Kafka record's FILE_COLUMN is "<topic>/<partition, 10 digits>/<offset, 20 digits>"
# (sources/frames.py): its partition and offset are at fixed places from the end.
KAFKA_FILE_FORMAT = "%s/%010d/%020d"
KAFKA_PARTITION_AT = (-31, 10)  # (start from the end, length)
KAFKA_OFFSET_AT = (-20, 20)
KPART_COLUMN = "_xsg_kp"  # ... read back once per row when some plan has a Kafka cut
KOFF_COLUMN = "_xsg_ko"
# A punctuated `files` or `kafka` stream's frame (sources/frames.py): a `$punctuation` record's
# value as JSON text ("" when the record cannot be read), null on a tuple; its `_xsg_seq` is the
# record's place in its lane: (partition << LANE_BITS) + offset, or the file's line
PUNCT_COLUMN = "_xsg_punct"
LANE_BITS = 40

__all__ = ["SEQ_COLUMN", "FILE_COLUMN", "POS_COLUMN", "TIME_COLUMN", "ORDER_NUMBER",
           "ORDER_EXACT", "NUMS_COLUMN",
           "STRS_COLUMN", "LNGS_COLUMN", "KEYS_COLUMN", "PLANS_COLUMN", "PIDS_COLUMN",
           "BITS_COLUMN", "READ_COLUMN", "TOP_COLUMN", "HASHED_PREFIX", "EMIT", "PLAN",
           "KAFKA_FILE_FORMAT", "KAFKA_PARTITION_AT", "KAFKA_OFFSET_AT", "KPART_COLUMN",
           "KOFF_COLUMN", "PUNCT_COLUMN", "LANE_BITS"]
