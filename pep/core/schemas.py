"""The schemas of the built-in streams: the paper's weather station and an AIS-like ship feed.

One definition serves the PEP core (conditions are checked against it), the stream catalogue
(`POST /streams` may name a built-in schema) and the runtime's generators (which produce it).
"""
from __future__ import annotations

from pep.core.plan import Field, StreamSchema

# The paper's weather station (eXACML+ Example 1).
WEATHER_SCHEMA = StreamSchema((
    Field("samplingtime", "timestamp"),
    Field("temperature", "double"),
    Field("humidity", "double"),
    Field("solarradiation", "double"),
    Field("rainrate", "double"),
    Field("windspeed", "double"),
    Field("winddirection", "long"),
    Field("barometer", "double"),
))

# AIS-like ship positions (ASSIST's port-authority example).
AIS_SCHEMA = StreamSchema((
    Field("mmsi", "long"),
    Field("shipname", "string"),
    Field("shiptype", "string"),
    Field("lat", "double"),
    Field("lon", "double"),
    Field("speed", "double"),
    Field("course", "double"),
    Field("ts", "timestamp"),
))

BUILTIN_SCHEMAS: dict[str, StreamSchema] = {"weather": WEATHER_SCHEMA, "ais": AIS_SCHEMA}
BUILTIN_TIME_ATTRIBUTES: dict[str, str] = {"weather": "samplingtime", "ais": "ts"}
