"""The pure query core: conditions, obligations, user queries, query graphs, merge, NR/PR
analysis, explain, and the access request's way from XACML decision to execution plan.

No Flask, Spark, SQLite or HTTP status here (see README.md); a test holds it to that.
"""
