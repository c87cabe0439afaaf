"""Delivery through plan topics (`delivery = "kafka"`, pep/delivery): each plan's rows of a
micro-batch written once to the plan's Kafka topic. Row plans' rows by Spark's Kafka sink on the
workers, inside the stream's foreachBatch (`topic_rows.py`, never collected to the driver);
windows and unions of grants, which the driver finishes, by the driver's producer
(`driver_rows.py`). No Spark import here: import the modules."""
