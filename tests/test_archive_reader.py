"""The archive reader: every check of the contract's "must check" list stops the scan with
an error naming the file and rba, and the catalog is left exactly as it was.

Archives here are written record by record with the project's archive writer, so each
test shows the one defect it is about.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from trailbound.archive import reader
from trailbound.archive.catalog import ArchiveCatalog
from trailbound.archive.segments import discover
from trailbound.archive.writer import write_defs, write_segment
from trailbound.positions import Scn
from trailbound.errors import ArchiveError

pytestmark = [pytest.mark.spark, pytest.mark.pg]

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
DEFS = [{"name": "shop.orders", "columns": [{"name": "id", "type": "bigint", "nullable": False},
                                            {"name": "note", "type": "text", "nullable": True}], "key": ["id"]}]


def rec(scn, xid, op, table=None, before=None, after=None, parent_xid=None, **extra):
    return {"scn": scn, "ts": T0 + timedelta(seconds=scn), "xid": xid, "parent_xid": parent_xid, "op": op,
            "table": table, "before": before, "after": after, **extra}


def ins(scn, xid, key, parent_xid=None):
    return rec(scn, xid, "INSERT", "shop.orders", after={"id": key, "note": f"n{key}"}, parent_xid=parent_xid)


def segment(archive: Path, sequence: int, records: list[dict], first_scn: int, next_scn: int, fmt="parquet",
            thread=1, **kwargs) -> Path:
    return write_segment(archive, thread=thread, sequence=sequence, records=records, first_scn=Scn(first_scn),
                         next_scn=Scn(next_scn), first_time=T0 + timedelta(seconds=first_scn),
                         next_time=T0 + timedelta(seconds=next_scn), fmt=fmt, **kwargs)


@pytest.fixture
def archive(tmp_path) -> Path:
    """A good two-segment archive: T1 spans both segments, T2 commits in the first."""
    root = tmp_path / "archive"
    root.mkdir()
    write_defs(root, DEFS)
    segment(root, 1, [rec(100, "T1", "BEGIN"), ins(101, "T1", 1), ins(102, "T2", 2), rec(103, "T2", "COMMIT")], 100, 200)
    segment(root, 2, [ins(200, "T1", 3), rec(201, "T1", "COMMIT")], 200, 300, fmt="jsonl")
    return root


@pytest.fixture
def catalog(store):
    return ArchiveCatalog(store, "SRC")


def cataloged(catalog) -> list[tuple[int, int]]:
    return [(e.segment.thread, e.segment.sequence) for e in catalog.entries()]


def scan_fails(catalog, archive, spark, path_name: str, rba, message: str) -> ArchiveError:
    before = cataloged(catalog)
    with pytest.raises(ArchiveError) as error:
        catalog.scan(archive, spark)
    assert Path(error.value.path).name == path_name
    assert error.value.rba == rba
    assert message in error.value.message
    assert path_name in str(error.value) and (rba is None or f"rba {rba}" in str(error.value))
    assert cataloged(catalog) == before, "a failed scan must write nothing"
    return error.value


def test_a_good_archive_is_cataloged_once(catalog, archive, spark):
    result = catalog.scan(archive, spark)
    assert [(s.thread, s.sequence, s.records) for s in result.added] == [(1, 1, 4), (1, 2, 2)]
    assert catalog.scan(archive, spark).added == []  # re-running finds nothing new
    assert cataloged(catalog) == [(1, 1), (1, 2)]


def test_both_encodings_give_the_same_records(tmp_path, spark):
    records = [rec(10, "a/../x", "BEGIN"), ins(11, "a/../x", 7), rec(12, "S1", "UPDATE", "shop.orders",
               before={"id": 7}, after={"id": 7, "note": "\u00e9\u6f22 'q' \"d\" \\"}, parent_xid="a/../x"),
               rec(13, "a/../x", "COMMIT")]
    rows = {}
    for fmt in ("parquet", "jsonl"):
        root = tmp_path / fmt
        root.mkdir()
        segment(root, 1, records, 10, 20, fmt=fmt)
        frame = reader.read_records(spark, discover(root)).orderBy("rba")
        rows[fmt] = [r.asDict() | {"file": None} for r in frame.collect()]
    assert rows["parquet"] == rows["jsonl"]
    assert rows["jsonl"][2]["parent_xid"] == "a/../x" and rows["jsonl"][1]["ts"].second == 11


def test_json_lines_may_carry_images_as_nested_objects(tmp_path, spark):
    root = tmp_path / "nested"
    root.mkdir()
    line = {"rba": 0, "scn": 5, "ts": "2026-11-01T00:00:05Z", "xid": "X", "parent_xid": None, "op": "INSERT",
            "table": "shop.orders", "before": None, "after": {"id": 1, "note": "é"}}
    segment(root, 1, [rec(5, "X", "INSERT", "shop.orders", after={"id": 1, "note": "é"})], 5, 6, fmt="jsonl")
    data = root / "arch_1_000000001.jsonl"
    data.write_text(json.dumps(line, ensure_ascii=False) + "\n", encoding="utf-8")  # an object, not a string
    [row] = reader.read_records(spark, discover(root)).collect()
    assert json.loads(row["after"]) == {"id": 1, "note": "é"}


# ------------------------------------------------------------------ file-level checks

def test_sha256_mismatch(catalog, archive, spark):
    segment(archive, 3, [ins(300, "T3", 4), rec(301, "T3", "COMMIT")], 300, 400, manifest_overrides={"sha256": "0" * 64})
    scan_fails(catalog, archive, spark, "arch_1_000000003.parquet", None, "sha256")


def test_record_count_mismatch(catalog, archive, spark):
    segment(archive, 3, [ins(300, "T3", 4), rec(301, "T3", "COMMIT")], 300, 400, fmt="jsonl",
            manifest_overrides={"records": 3})
    scan_fails(catalog, archive, spark, "arch_1_000000003.jsonl", 2, "holds 2 records, the manifest says 3")


def test_sequence_gap(catalog, archive, spark):
    catalog.scan(archive, spark)
    segment(archive, 4, [ins(300, "T3", 4), rec(301, "T3", "COMMIT")], 300, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000004.json", None, "sequence gap: thread 1 goes from sequence 2 to 4")


def test_first_scn_must_continue_the_previous_segment(catalog, archive, spark):
    segment(archive, 3, [ins(310, "T3", 4)], 310, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000003.json", 0, "does not equal next_scn 300")


# ------------------------------------------------------------------ record-level checks

@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_scn_going_backwards(catalog, archive, spark, fmt):
    segment(archive, 3, [ins(310, "T3", 4), ins(305, "T3", 5), rec(311, "T3", "COMMIT")], 300, 400, fmt=fmt)
    scan_fails(catalog, archive, spark, f"arch_1_000000003.{fmt}", 1, "scn goes backwards: 305 after 310")


def test_scn_outside_the_segment_range(catalog, archive, spark):
    segment(archive, 3, [ins(300, "T3", 4), rec(400, "T3", "COMMIT")], 300, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000003.parquet", 1, "outside the segment's range [300, 400)")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_rba_gap(catalog, archive, spark, fmt):
    records = [ins(300, "T3", 4) | {"rba": 0}, ins(301, "T3", 5) | {"rba": 1}, rec(302, "T3", "COMMIT", rba=3)]
    segment(archive, 3, records, 300, 400, fmt=fmt)
    scan_fails(catalog, archive, spark, f"arch_1_000000003.{fmt}", 3, "rba gap: rba 3 follows rba 1")


def test_rba_not_starting_at_zero(catalog, archive, spark):
    segment(archive, 3, [ins(300, "T3", 4) | {"rba": 1}, rec(302, "T3", "COMMIT", rba=2)], 300, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000003.parquet", 1, "starts at rba 1, not 0")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_unknown_op(catalog, archive, spark, fmt):
    segment(archive, 3, [ins(300, "T3", 4), rec(301, "T3", "MERGE", "shop.orders"), rec(302, "T3", "COMMIT")],
            300, 400, fmt=fmt)
    scan_fails(catalog, archive, spark, f"arch_1_000000003.{fmt}", 1, "unknown op MERGE")


def test_dml_without_a_table(catalog, archive, spark):
    segment(archive, 3, [ins(300, "T3", 4), rec(301, "T3", "DELETE", None, before={"id": 4}),
                         rec(302, "T3", "COMMIT")], 300, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000003.parquet", 1, "DELETE without a table")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_commit_of_a_subtransaction(catalog, archive, spark, fmt):
    segment(archive, 3, [ins(300, "T3", 4), ins(301, "S3", 5, parent_xid="T3"),
                         rec(302, "S3", "COMMIT", parent_xid="T3")], 300, 400, fmt=fmt)
    scan_fails(catalog, archive, spark, f"arch_1_000000003.{fmt}", 2, "COMMIT of subtransaction S3")


@pytest.mark.parametrize("end", ["COMMIT", "ROLLBACK"])
def test_a_record_after_its_transaction_ended(catalog, archive, spark, end):
    segment(archive, 3, [ins(300, "T3", 4), rec(301, "T3", end), ins(302, "T4", 6), ins(303, "T3", 5)], 300, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000003.parquet", 3, f"record of transaction T3 after its {end}")


def test_a_subtransaction_record_after_its_rollback_or_its_parents_end(catalog, archive, spark):
    segment(archive, 3, [ins(300, "T3", 4), ins(301, "S3", 5, parent_xid="T3"),
                         rec(302, "S3", "ROLLBACK", parent_xid="T3"), ins(303, "S3", 6, parent_xid="T3")], 300, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000003.parquet", 3, "record of transaction S3 after its ROLLBACK")


def test_a_subtransaction_record_after_the_top_level_commit(catalog, archive, spark):
    segment(archive, 3, [ins(300, "T3", 4), ins(301, "S3", 5, parent_xid="T3"), rec(302, "T3", "COMMIT"),
                         ins(303, "S3", 6, parent_xid="T3")], 300, 400)
    scan_fails(catalog, archive, spark, "arch_1_000000003.parquet", 3, "subtransaction S3 after its transaction T3 ended")


def test_a_record_after_commit_several_segments_later_in_one_scan(catalog, tmp_path, spark):
    # One thread's new segments are checked in runs, a task per core: the runs are then
    # checked against each other (T2 ends in the first run, a record of it is in the last).
    root = tmp_path / "single"
    root.mkdir()
    write_defs(root, DEFS)
    segment(root, 1, [ins(100, "T1", 1), rec(101, "T1", "COMMIT"), ins(102, "T2", 2), rec(103, "T2", "COMMIT")], 100, 200)
    for sequence in (2, 3):
        scn = 100 * sequence
        segment(root, sequence, [ins(scn, f"U{sequence}", sequence), rec(scn + 1, f"U{sequence}", "COMMIT"),
                                 ins(scn + 2, f"V{sequence}", sequence), rec(scn + 3, f"V{sequence}", "COMMIT")],
                scn, scn + 100)
    segment(root, 4, [ins(400, "W", 7), ins(401, "T2", 8), rec(402, "W", "COMMIT"), rec(403, "T2", "COMMIT")], 400, 500)
    scan_fails(catalog, root, spark, "arch_1_000000004.parquet", 1,
               "record of transaction T2 after its COMMIT at sequence 1 rba 3")


def test_a_record_after_commit_in_a_later_segment_is_found_by_verify(catalog, archive, spark):
    catalog.scan(archive, spark)
    segment(archive, 3, [ins(300, "T2", 9)], 300, 400)  # T2 committed in sequence 1
    with pytest.raises(ArchiveError) as error:
        catalog.verify(archive, spark)
    assert Path(error.value.path).name == "arch_1_000000003.parquet" and error.value.rba == 0
    assert "record of transaction T2 after its COMMIT at sequence 1 rba 3" in error.value.message


def test_malformed_json_line(catalog, archive, spark):
    path = segment(archive, 3, [ins(300, "T3", 4), rec(301, "T3", "COMMIT")], 300, 400, fmt="jsonl")
    data = path.with_suffix(".jsonl")
    lines = data.read_text().splitlines()
    data.write_text(lines[0] + "\n" + "{not json\n")
    manifest = json.loads(path.read_text())
    import hashlib
    manifest.update(sha256=hashlib.sha256(data.read_bytes()).hexdigest(), bytes=data.stat().st_size)
    path.write_text(json.dumps(manifest))
    scan_fails(catalog, archive, spark, "arch_1_000000003.jsonl", 1, "line 2 is not well-formed JSON")


def test_a_segment_changed_after_cataloging_is_refused(catalog, archive, spark):
    catalog.scan(archive, spark)
    (archive / "arch_1_000000002.json").unlink()
    segment(archive, 2, [ins(200, "T1", 3), ins(201, "T1", 4), rec(202, "T1", "COMMIT")], 200, 300, fmt="jsonl")
    scan_fails(catalog, archive, spark, "arch_1_000000002.json", None, "changed after it was cataloged")
