"""Built-in synthetic streams: the paper's weather station and an AIS-like ship feed.

Both are deterministic functions of the `rate` source's counter (so a run can be recomputed),
stamped with the rate source's wall-clock timestamp as event time. The counter is kept as the
ordering key `_xsg_seq`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pep.core.plan import StreamSchema

# The schemas the generators produce (one definition, shared with the PEP core).
from pep.core.schemas import (  # noqa: F401 - re-exported
    AIS_SCHEMA,
    BUILTIN_SCHEMAS as GENERATOR_SCHEMAS,
    BUILTIN_TIME_ATTRIBUTES as GENERATOR_TIME_ATTRIBUTES,
    WEATHER_SCHEMA,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


SHIP_COUNT = 25
SHIP_TYPES = ("cargo", "tanker", "passenger", "fishing", "tug")


def _noise(v: Column, prime: int, spread: float) -> Column:
    """A repeatable pseudo-random value in [-spread, spread) from the counter."""
    return ((v * prime) % 1000) / 1000.0 * (2 * spread) - spread


def _weather_columns(v: Column, ts: Column) -> dict[str, Column]:
    from pyspark.sql import functions as F
    day = F.sin(v / 240.0)
    return {
        "samplingtime": ts,
        "temperature": F.round(22 + 8 * day + _noise(v, 7919, 1.5), 2),
        "humidity": F.round(60 - 20 * day + _noise(v, 104729, 5.0), 2),
        "solarradiation": F.round(F.greatest(F.lit(0.0), 700 * day + _noise(v, 1299709, 40.0)), 1),
        "rainrate": F.round(F.greatest(F.lit(0.0), _noise(v, 15485863, 6.0)), 2),
        "windspeed": F.round(F.abs(12 * F.cos(v / 90.0) + _noise(v, 32452843, 3.0)), 2),
        "winddirection": ((v * 37) % 360).cast("long"),
        "barometer": F.round(1010 + 6 * F.sin(v / 600.0) + _noise(v, 49979687, 0.8), 2),
    }


def _ais_columns(v: Column, ts: Column) -> dict[str, Column]:
    from pyspark.sql import functions as F
    ship = v % SHIP_COUNT
    leg = F.floor(v / SHIP_COUNT)
    types = F.array(*[F.lit(t) for t in SHIP_TYPES])
    return {
        "mmsi": (F.lit(244000000) + ship).cast("long"),
        "shipname": F.concat(F.lit("VESSEL-"), F.lpad(ship.cast("string"), 2, "0")),
        "shiptype": F.element_at(types, (ship % len(SHIP_TYPES) + 1).cast("int")),
        "lat": F.round(1.18 + 0.002 * leg * F.sin(ship.cast("double")) + 0.005 * ship, 5),
        "lon": F.round(103.62 + 0.002 * leg * F.cos(ship.cast("double")) + 0.015 * ship, 5),
        "speed": F.round(F.abs(14 * F.sin((leg + ship) / 30.0)) + 0.5, 2),
        "course": F.round((ship * 47 + leg * 3) % 360, 1).cast("double"),
        "ts": ts,
    }


_BUILDERS = {"weather": _weather_columns, "ais": _ais_columns}


def generator_frame(spark: SparkSession, kind: str, rate: int, schema: StreamSchema
                    ) -> DataFrame:
    """A streaming DataFrame of `kind` at `rate` rows/s shaped to the declared `schema`.

    The declared schema may list a subset of the generator's attributes (case-insensitive) and
    any types Spark can cast to; unknown attributes are an error.
    """
    from pyspark.sql import functions as F
    if kind not in _BUILDERS:
        raise ValueError(f"unknown generator schema {kind!r} (known: {', '.join(_BUILDERS)})")
    raw = spark.readStream.format("rate").option("rowsPerSecond", str(rate)).load()
    columns = _BUILDERS[kind](F.col("value"), F.col("timestamp"))
    select = []
    for field in schema.fields:
        source = columns.get(field.name.lower())
        if source is None:
            raise ValueError(f"generator {kind!r} has no attribute {field.name!r} "
                             f"(it has: {', '.join(columns)})")
        select.append(source.cast(field.type).alias(field.name))
    select.append(F.col("value").cast("long").alias("_xsg_seq"))
    return raw.select(*select)
