"""The redo archive contract: names, fields and rules shared by every reader and writer.

The archive is an interface written by tools outside this project (docs/redo-archive.md
describes it in full). Everything that knows a file name pattern, a field name or an
operation code imports it from here, so the contract lives in exactly one place.
"""

from __future__ import annotations

import re

DEFS_FILE = "defs.json"

# arch_<thread>_<9-digit sequence>.<ext>; the manifest is .json, the data .parquet/.jsonl.
SEGMENT_RE = re.compile(r"^arch_(?P<thread>[1-9][0-9]*)_(?P<sequence>[0-9]{9})\.(?P<ext>json|jsonl|parquet)$")
FORMATS = ("parquet", "jsonl")

MANIFEST_FIELDS = (
    "thread", "sequence", "first_scn", "next_scn", "first_time", "next_time",
    "records", "bytes", "sha256", "format",
)
MANIFEST_OPTIONAL = ("closed",)

RECORD_FIELDS = ("rba", "scn", "ts", "xid", "parent_xid", "op", "table", "before", "after")

OPS = ("BEGIN", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "COMMIT", "ROLLBACK")
DML_OPS = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
END_OPS = ("COMMIT", "ROLLBACK")

MAX_XID_LENGTH = 128


def segment_stem(thread: int, sequence: int) -> str:
    return f"arch_{thread}_{sequence:09d}"


def manifest_name(thread: int, sequence: int) -> str:
    return segment_stem(thread, sequence) + ".json"


def data_name(thread: int, sequence: int, fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown segment format {fmt!r}")
    return segment_stem(thread, sequence) + "." + fmt


def split_table_name(name: str) -> tuple[str, str]:
    """`schema.table` -> (schema, table). The schema ends at the first dot; the table
    name may itself contain dots, quotes or any other character."""
    schema, dot, table = name.partition(".")
    if not dot or not schema or not table:
        raise ValueError(f"table name {name!r} is not of the form schema.table")
    return schema, table
