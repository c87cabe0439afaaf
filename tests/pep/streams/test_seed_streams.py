"""The example streams of policies/streams.json seed an empty catalogue, once."""
from __future__ import annotations

from pathlib import Path

from pep.core.schemas import WEATHER_SCHEMA
from pep.streams.catalog import StreamCatalog, seed_streams

EXAMPLES = Path(__file__).resolve().parents[3] / "policies" / "streams.json"


def test_examples_seed_an_empty_catalogue_once(tmp_path, storage):
    catalog = StreamCatalog(storage.database("streams"), tmp_path)
    try:
        assert seed_streams(catalog, EXAMPLES) == ["weather", "ais", "vitals", "routes",
                                                  "position"]
        weather = catalog.get("weather")
        assert weather.owner == "nea" and weather.source.kind == "ingest"
        assert weather.schema == WEATHER_SCHEMA  # the API-fed stream has the generator's schema
        assert weather.time_attribute == "samplingtime"
        assert catalog.get("ais").source.kind == "generator"
        # a catalogue that already holds streams is left alone (owners' changes survive restarts)
        assert seed_streams(catalog, EXAMPLES) == []
        assert len(catalog.all()) == 5
        assert catalog.combining("ais") == "union"
        level = catalog.get("position").schema.lookup("level")
        assert level.type == "label" and level.lattice.categories == ("nuclear", "crypto", "army")
    finally:
        catalog.close()


def test_missing_file_seeds_nothing(tmp_path, storage):
    catalog = StreamCatalog(storage.database("streams"), tmp_path)
    try:
        assert seed_streams(catalog, tmp_path / "absent.json") == []
        assert catalog.all() == []
    finally:
        catalog.close()


def test_a_catalogue_whose_streams_were_all_deleted_is_not_seeded_again(tmp_path, storage):
    catalog = StreamCatalog(storage.database("streams"), tmp_path)
    try:
        seed_streams(catalog, EXAMPLES)
        for entry in catalog.all():
            catalog.begin_delete(entry.definition.name)
            catalog.finish_delete(entry.definition.name, "nea", None)
        assert catalog.all() == []
        assert seed_streams(catalog, EXAMPLES) == []  # the owner's deletions survive restarts
    finally:
        catalog.close()
