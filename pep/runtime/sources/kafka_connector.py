"""Where Spark's Kafka connector comes from (its jars), and why it is missing when it is.

Below the session and the sources: `session.py` puts the jars on `spark.jars`, `sources/frames.py`
names the reason in the error of a Kafka stream that cannot start."""
from __future__ import annotations

import os
from pathlib import Path

# Spark's Kafka connector is not in the pyspark wheel: `make install` (deploy/fetch_kafka_jars.sh)
# fetches it for the installed pyspark into the checkout's cache; XSG_KAFKA_JARS names another
# directory of jars (a deployment that is not a checkout).
KAFKA_CACHE = Path(os.environ.get("XSG_KAFKA_CACHE")
                   or Path(__file__).resolve().parents[3] / ".cache" / "kafka")


def kafka_connector_jars() -> list[str]:
    """The jars that give Spark its Kafka source, for the installed pyspark: from the directory
    XSG_KAFKA_JARS names, else from the checkout's cache when its fetch completed; [] when there
    are none (Kafka streams then fail saying so; everything else runs without them)."""
    from importlib.metadata import version

    named = os.environ.get("XSG_KAFKA_JARS")
    directory = Path(named) if named else KAFKA_CACHE / f"spark-{version('pyspark')}"
    if not named and not (directory / ".complete").is_file():
        return []
    return sorted(str(p) for p in directory.glob("*.jar"))


def kafka_unavailable_reason() -> str | None:
    """Why the Kafka connector is missing (the fetch's note, e.g. no mvn), or None."""
    note = KAFKA_CACHE / "unavailable.txt"
    if kafka_connector_jars():
        return None
    if note.is_file():
        return note.read_text(encoding="utf-8").strip()
    return ("Spark's Kafka connector was not fetched: run `make install` (it needs mvn and "
            "Maven Central), or set XSG_KAFKA_JARS to a directory holding "
            "spark-sql-kafka-0-10_2.13 for this pyspark and its dependencies")
