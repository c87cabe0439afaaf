"""The stream catalogue's rows: its tables (a versioned schema, `SCHEMA`, on SQLite or PostgreSQL;
on SQLite also the columns added before schemas had versions), the records read from them
(`StreamEntry`, `DeletedStream`), and a schema as a row stores it."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from common.db import Cursor, Row
from common.migrations import Schema, Step
from pep.core.labels import Lattice
from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.streams.definition import LISTED, StreamSettings

log = logging.getLogger(__name__)

# The column behind each setting an owner may change (`definition.PATCHABLE`); the schema
# fields are written as `schema_json` and `optional_json`.
PATCH_COLUMNS = {"visibility": "visibility", "description": "description",
                 "lateness": "lateness", "retention": "retention", "combining": "combining"}

CATALOG_TABLES = ("CREATE TABLE IF NOT EXISTS streams ("
                  " name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,"
                  " schema_json TEXT NOT NULL, source_json TEXT NOT NULL, time_attribute TEXT,"
                  " created_at TEXT NOT NULL, next_seq INTEGER NOT NULL DEFAULT 1,"
                  " visibility TEXT NOT NULL DEFAULT 'listed',"
                  " description TEXT NOT NULL DEFAULT '',"
                  " lateness REAL, retention REAL, optional_json TEXT NOT NULL DEFAULT '[]',"
                  " combining TEXT);"
                  "CREATE TABLE IF NOT EXISTS deleted_streams ("
                  " name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,"
                  " deleted_at TEXT NOT NULL, deleted_by TEXT NOT NULL)")
# Columns added since the first stores were written: (name, its definition for ALTER TABLE).
ADDED_COLUMNS = (("visibility", "TEXT NOT NULL DEFAULT 'listed'"),
                 ("description", "TEXT NOT NULL DEFAULT ''"),
                 ("lateness", "REAL"), ("retention", "REAL"),
                 ("optional_json", "TEXT NOT NULL DEFAULT '[]'"), ("combining", "TEXT"))


def _added_columns(cur: Cursor) -> None:
    """A catalogue written by an earlier release gets the columns added since, with their
    default (an existing stream stays `listed`, as every stream was)."""
    have = {row[1] for row in cur.execute("PRAGMA table_info(streams)").fetchall()}
    for column, definition in ADDED_COLUMNS:
        if column not in have:
            cur.execute(f"ALTER TABLE streams ADD COLUMN {column} {definition}")
            log.info("stream catalogue: added column %s", column)


# The catalogue's versioned schema (`common.migrations`). Names are case-insensitive (SQLite's
# NOCASE; on PostgreSQL an ICU collation that ignores case, created with the tables); what the
# catalogue orders by compares as bytes, as SQLite's does.
SCHEMA = Schema("streams", (
    Step("streams and deleted streams' names",
         sqlite=(*CATALOG_TABLES.split(";"), _added_columns),
         postgresql=(
             "CREATE COLLATION IF NOT EXISTS xsg_nocase (provider = icu,"
             " locale = 'und-u-ks-level2', deterministic = false)",
             "CREATE TABLE streams (name TEXT COLLATE xsg_nocase PRIMARY KEY,"
             " owner TEXT NOT NULL, schema_json TEXT NOT NULL, source_json TEXT NOT NULL,"
             " time_attribute TEXT, created_at TEXT NOT NULL,"
             " next_seq BIGINT NOT NULL DEFAULT 1, visibility TEXT NOT NULL DEFAULT 'listed',"
             " description TEXT NOT NULL DEFAULT '', lateness DOUBLE PRECISION,"
             " retention DOUBLE PRECISION, optional_json TEXT NOT NULL DEFAULT '[]',"
             " combining TEXT)",
             "CREATE TABLE deleted_streams (name TEXT COLLATE xsg_nocase PRIMARY KEY,"
             " owner TEXT NOT NULL, deleted_at TEXT NOT NULL, deleted_by TEXT NOT NULL)")),
    # derived streams (issue 48, `pep.streams.derivations`): which handle feeds each, on which
    # stream, under which plan and policies, and whether its feed still runs
    Step("derived streams and what they derive from",
         sqlite=("CREATE TABLE IF NOT EXISTS derivations ("
                 " stream TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,"
                 " source TEXT NOT NULL, handle_id TEXT NOT NULL, plan_json TEXT NOT NULL,"
                 " plan_key TEXT NOT NULL, policy_ids TEXT NOT NULL, created_at TEXT NOT NULL,"
                 " state TEXT NOT NULL, ended_at TEXT, reason TEXT)",
                 "CREATE INDEX IF NOT EXISTS derivations_by_handle ON derivations (handle_id)"),
         postgresql=("CREATE TABLE derivations (stream TEXT COLLATE xsg_nocase PRIMARY KEY,"
                     " owner TEXT NOT NULL, source TEXT NOT NULL, handle_id TEXT NOT NULL,"
                     " plan_json TEXT NOT NULL, plan_key TEXT NOT NULL,"
                     " policy_ids TEXT NOT NULL, created_at TEXT NOT NULL, state TEXT NOT NULL,"
                     " ended_at TEXT, reason TEXT)",
                     "CREATE INDEX derivations_by_handle ON derivations (handle_id)")),
))
# The columns of a stream's row, in the order `entry_from_row` reads them.
ENTRY_COLUMNS = ("name, owner, schema_json, source_json, time_attribute, created_at, next_seq,"
                 " visibility, description, lateness, retention, optional_json, combining")


def schema_json(fields: tuple[Field, ...]) -> str:
    """A schema as stored: [name, type] per attribute, and a label's lattice after them."""
    return json.dumps([[f.name, f.type] + ([f.lattice.to_json()] if f.lattice else [])
                       for f in fields])


@dataclass(frozen=True)
class StreamEntry:
    definition: StreamDefinition
    created_at: str
    next_seq: int
    visibility: str = LISTED  # `pep.streams.visibility`: listed or restricted
    description: str = ""
    retention: float | None = None  # seconds in the archive; None: the gateway's default
    optional: tuple[str, ...] = ()  # attributes added after registration: records may omit them
    combining: str | None = None  # `pep.core.union`: the owner's mode; None: the gateway's

    def settings(self) -> StreamSettings:
        """The owner's settings as `describe` shows them (None: the gateway's default)."""
        return {"description": self.description, "lateness": self.definition.lateness,
                "retention": self.retention}


@dataclass(frozen=True)
class DeletedStream:
    """A deleted stream's name, reserved to its former owner (`register`)."""

    name: str
    owner: str
    deleted_at: str
    deleted_by: str


def entry_from_row(row: Row) -> StreamEntry:
    """A stream as read from its row (the columns of ENTRY_COLUMNS, in that order)."""
    name, owner, schema_json, source_json, time_attribute, created_at, next_seq, \
        visibility, description, lateness, retention, optional_json, combining = row
    schema = StreamSchema(tuple(
        Field(f[0], f[1], Lattice.from_json(f[2]) if len(f) > 2 else None)
        for f in json.loads(schema_json)))
    kind, options = json.loads(source_json)
    source = SourceSpec(kind, tuple((k, v) for k, v in options))
    return StreamEntry(StreamDefinition(name, owner, schema, source, time_attribute,
                                        lateness),
                       created_at, next_seq, visibility, description, retention,
                       tuple(json.loads(optional_json)), combining)


__all__ = ["ADDED_COLUMNS", "CATALOG_TABLES", "SCHEMA", "ENTRY_COLUMNS", "PATCH_COLUMNS",
           "DeletedStream", "StreamEntry", "entry_from_row", "schema_json"]
