"""Table versions without a server: defs.json with and without versions, each trail record
numbered by its src_scn, which type changes replicat counts as widening."""

from __future__ import annotations

import pyarrow as pa
import pytest

from trailbound.archive.segments import load_defs, versions_of
from trailbound.archive.writer import write_defs
from trailbound.errors import ArchiveError
from trailbound.replicat.ddl import widens
from trailbound.trail import format as trail

COLUMNS = [{"name": "id", "type": "integer", "nullable": False}]
WIDER = COLUMNS + [{"name": "note", "type": "text", "nullable": True, "default": "x"}]


def test_an_archive_without_versions_reads_as_version_1_and_versions_round_trip(tmp_path):
    write_defs(tmp_path, [{"name": "shop.a", "columns": COLUMNS, "key": ["id"]}])
    (table,) = load_defs(tmp_path).values()
    assert [(v.version, v.scn) for v in table.versions] == [(1, 0)] and table.version_at(10**9).version == 1
    assert "versions" not in table.as_json()
    grown = table.with_version(tuple(load_defs(_with(tmp_path / "b", WIDER))["shop.a"].columns), ("id",), 500)
    write_defs(tmp_path, [grown.as_json()])
    again = load_defs(tmp_path)["shop.a"]
    assert again == grown and again.columns[-1].default == "x"
    assert [again.version_at(scn).version for scn in (0, 499, 500, 10**9)] == [1, 1, 2, 2]
    assert versions_of({"shop.a": again}) == {"shop.a": [(0, 1), (500, 2)]}


def _with(path, columns):
    write_defs(path, [{"name": "shop.a", "columns": columns, "key": ["id"]}])
    return path


def test_versions_out_of_order_or_unlike_the_top_level_are_refused(tmp_path):
    version = {"version": 1, "scn": 0, "columns": COLUMNS, "key": ["id"]}
    write_defs(tmp_path, [{"name": "shop.a", "columns": COLUMNS, "key": ["id"],
                           "versions": [version, {**version, "version": 2, "scn": 0}]}])
    with pytest.raises(ArchiveError, match="increasing scn"):
        load_defs(tmp_path)
    write_defs(tmp_path, [{"name": "shop.a", "columns": WIDER, "key": ["id"], "versions": [version]}])
    with pytest.raises(ArchiveError, match="must be those of its last version"):
        load_defs(tmp_path)


def test_each_record_is_numbered_by_its_src_scn_and_older_ones_lose_their_copy_line():
    records = pa.table({"table": ["shop.a", "shop.a", None, "shop.b", "shop.a"],
                        "src_scn": pa.array([10, 500, 600, 700, 900], pa.int64()),
                        "copy_line": ["1\n", "2\tx\n", None, "7\n", "3\ty\n"]})
    versions = {"shop.a": [(0, 1), (500, 2)], "shop.b": [(650, 1)]}
    numbered = trail.with_table_versions(records, versions)
    assert numbered.column("table_version").to_pylist() == [1, 2, None, 1, 2]
    assert trail.without_stale_lines(numbered, versions).column("copy_line").to_pylist() == \
        [None, "2\tx\n", None, "7\n", "3\ty\n"]


@pytest.mark.parametrize("old, new, wider", [
    ("integer", "bigint", True), ("smallint", "integer", True), ("bigint", "integer", False),
    ("character varying(10)", "character varying(20)", True), ("character varying(10)", "text", True),
    ("character varying(10)", "character varying(5)", False), ("text", "character varying(5)", False),
    ("numeric(8,2)", "numeric(10,2)", True), ("numeric(8,2)", "numeric(8,3)", False),
    ("numeric(8,2)", "numeric", True), ("numeric", "numeric(30,4)", False), ("real", "double precision", True),
    ("integer", "text", False), ("date", "timestamp without time zone", False),
])
def test_what_counts_as_widening(old, new, wider):
    assert widens(old, new) is wider
