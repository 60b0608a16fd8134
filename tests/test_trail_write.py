"""The trail written from Spark tasks: the rollover plan, transaction indicators, files
written in pieces by several writers, and the driver's check before the commit (a task
that wrote where the driver cannot see fails the run)."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest

from trailbound.capture import trailwrite
from trailbound.errors import TrailboundError
from trailbound.positions import Csn, Scn
from trailbound.trail import format as trails


def test_rollover_happens_after_the_transaction_that_reaches_the_size():
    assert trails.plan_rollover(np.array([5, 5, 5, 20, 1, 1, 1]), 10).tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert trails.plan_rollover(np.array([30]), 10).tolist() == [0]
    assert trails.plan_rollover(np.array([], dtype=np.int64), 10).tolist() == []


def test_transaction_indicators_follow_the_csn_runs():
    csn = np.array([7, 7, 7, 8, 9, 9])
    assert trails.transaction_indicators([csn]).tolist() == [trails.BEGIN, trails.MIDDLE, trails.END, trails.WHOLE,
                                                             trails.BEGIN, trails.END]


def _records(transactions: list[tuple[int, int]], file_numbers: list[int]) -> pa.Table:
    """Trail rows (all but rba, trans_ind) of (csn, records) transactions, with file_no."""
    rows = []
    for (csn, count), number in zip(transactions, file_numbers):
        for k in range(count):
            rows.append({"csn": csn, "csn_thread": 1, "csn_sequence": 1, "csn_rba": csn, "xid": f"x{csn}",
                         "commit_ts": datetime(2026, 11, 1, tzinfo=timezone.utc), "op": "INSERT", "table": "s.t",
                         "before": None, "after": '{"k": 1}', "src_thread": 1, "src_sequence": 1,
                         "src_rba": csn * 10 + k, "src_scn": csn, "log_bsn": 5, "file_no": number})
    fields = [f for f in trails.SCHEMA if f.name not in ("rba", "trans_ind")] + [pa.field("file_no", pa.int64())]
    return pa.Table.from_pylist(rows, pa.schema(fields))


def test_files_written_in_pieces_are_the_files_one_writer_writes(tmp_path):
    table = _records([(10, 3), (11, 1), (12, 2)], [0, 0, 1])
    # Two writers, each given its files' records in batches that cut through a transaction.
    first = list(trails.write_planned_files(tmp_path / "a" / "lt", 4, table.slice(0, 4).to_batches(max_chunksize=2),
                                            group="EXT1", log_bsn=Scn(5)))
    second = list(trails.write_planned_files(tmp_path / "a" / "lt", 4, table.slice(4).to_batches(max_chunksize=1),
                                             group="EXT1", log_bsn=Scn(5)))
    whole = list(trails.write_planned_files(tmp_path / "b" / "lt", 4, table.to_batches(), group="EXT1",
                                            log_bsn=Scn(5)))
    assert [f.seqno for f in first + second] == [4, 5] == [f.seqno for f in whole]
    assert [f.sha256 for f in first + second] == [f.sha256 for f in whole]
    written = trails.read_file(whole[0].path)
    assert written.column("rba").to_pylist() == [0, 1, 2, 3]
    assert written.column("trans_ind").to_pylist() == [trails.BEGIN, trails.MIDDLE, trails.END, trails.WHOLE]
    assert (whole[1].first_csn, whole[1].last_csn) == (Csn(12, 1, 1, 12), Csn(12, 1, 1, 12))


def test_records_out_of_commit_order_are_refused(tmp_path):
    table = _records([(11, 1), (10, 1)], [0, 0])
    with pytest.raises(TrailboundError, match="out of commit order"):
        list(trails.write_planned_files(tmp_path / "lt", 1, table.to_batches(), group="EXT1", log_bsn=Scn(5)))
    assert not list(trails.existing_files(tmp_path / "lt"))


def test_a_write_of_an_abandoned_run_publishes_nothing_once_a_newer_run_claimed_the_trail(tmp_path):
    """A Spark Connect client killed mid-write leaves its job running on the server; the
    next run writes the same file numbers. The late task of the abandoned run must not
    rename its file over the newer run's (which may already be verified and committed)."""
    prefix = tmp_path / "lt"
    abandoned = trails.claim(prefix)
    newer = trails.claim(prefix)
    table = _records([(10, 2), (11, 1)], [0, 0])
    [info] = trails.write_planned_files(prefix, 1, table.to_batches(), group="EXT1", log_bsn=Scn(5), claim=newer)
    committed = info.path.read_bytes()
    late = _records([(10, 2)], [0])
    with pytest.raises(TrailboundError, match="a newer run of EXT1 has claimed this trail"):
        list(trails.write_planned_files(prefix, 1, late.to_batches(), group="EXT1", log_bsn=Scn(5), claim=abandoned))
    assert info.path.read_bytes() == committed, "the newer run's file is untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lt.claim", "lt000000001"], "no temporary file left"


@pytest.fixture
def written(tmp_path):
    """A file as a task reports it, and the plan it was written to."""
    table = _records([(10, 2), (11, 1)], [0, 0])
    info = next(trails.write_planned_files(tmp_path / "lt", 1, table.to_batches(), group="EXT1", log_bsn=Scn(5)))
    row = {"file_no": 0, "path": str(info.path), "records": info.records, "bytes": info.bytes, "sha256": info.sha256,
           "first_csn": str(info.first_csn), "last_csn": str(info.last_csn)}
    plan = {0: {"records": 3, "first_csn": info.first_csn, "last_csn": info.last_csn}}
    return info, row, plan


def test_the_driver_accepts_what_the_tasks_wrote(written):
    info, row, plan = written
    assert trailwrite.verify([row], plan, 1, Scn(5)) == [info]


def test_a_file_the_driver_cannot_see_fails_the_run(written, tmp_path):
    info, row, plan = written
    elsewhere = {**row, "path": str(tmp_path / "worker-local-disk" / info.path.name)}
    with pytest.raises(TrailboundError, match="the driver cannot read it"):
        trailwrite.verify([elsewhere], plan, 1, Scn(5))


def test_a_file_that_is_not_what_its_task_wrote_fails_the_run(written):
    info, row, plan = written
    info.path.write_bytes(info.path.read_bytes()[:-1] + b"\x00")
    with pytest.raises(TrailboundError, match="differs from the"):
        trailwrite.verify([row], plan, 1, Scn(5))


def test_a_planned_file_no_task_reported_fails_the_run(written):
    _, row, plan = written
    plan[1] = dict(plan[0])
    with pytest.raises(TrailboundError, match="seqno 2 was planned but no Spark task reported"):
        trailwrite.verify([row], plan, 1, Scn(5))


def test_a_file_with_other_records_than_planned_fails_the_run(written):
    _, row, plan = written
    plan[0]["records"] = 4
    with pytest.raises(TrailboundError, match="the plan has 4"):
        trailwrite.verify([row], plan, 1, Scn(5))


def test_a_file_is_read_a_row_group_at_a_time_and_a_wrong_rba_is_named(tmp_path, monkeypatch):
    """Files are written in row groups of ROW_GROUP_RECORDS, after a first one of
    FIRST_ROW_GROUP_RECORDS; read_parts gives a committed file one row group at a time
    (replicat applies the first before the rest is decoded): the same records as
    read_file, and a record out of place named by its rba, in the part that holds it."""
    monkeypatch.setattr(trails, "FIRST_ROW_GROUP_RECORDS", 2)
    monkeypatch.setattr(trails, "ROW_GROUP_RECORDS", 4)
    table = _records([(10, 3), (11, 1), (12, 5), (13, 2)], [0] * 4)
    (info,) = trails.write_planned_files(tmp_path / "lt", 1, table.to_batches(), group="EXT1", log_bsn=Scn(5))
    parts = list(trails.read_parts(info.path, sha256=info.sha256, records=info.records))
    assert [len(part) for part in parts] == [2, 4, 4, 1]
    assert pa.concat_tables(parts).equals(trails.read_file(info.path))
    with pytest.raises(TrailboundError, match="the trail lists 12"):
        next(trails.read_parts(info.path, sha256=info.sha256, records=12))

    # A writer that numbered the tenth record wrong (its checksum is the committed one).
    whole = trails.read_file(info.path)
    rbas = whole.column("rba").to_pylist()
    rbas[9] = 42
    wrong = trails.write_file(tmp_path / "bad" / "lt", 1, whole.set_column(0, "rba", pa.array(rbas, pa.int64())),
                              group="EXT1", log_bsn=Scn(5))
    parts = trails.read_parts(wrong.path, sha256=wrong.sha256, records=wrong.records)
    assert [len(next(parts)), len(next(parts))] == [2, 4]  # rbas 0-1 and 2-5; 9 is in the third
    with pytest.raises(TrailboundError, match=r"lt000000001.*rba 9: record 9 carries rba 42"):
        next(parts)


def test_a_version_3_file_still_reads_and_its_digest_is_still_checked(tmp_path):
    """A file as format version 3 wrote it (its footer and layouts in the Arrow schema, the
    digest over the whole file column by column) reads as it did: lines, layouts and all;
    a value changed behind its footer is refused."""
    import json

    import pyarrow.parquet as pq

    layouts = {"s.t": (("k", "integer"),)}
    table = _records([(10, 3), (11, 1)], [0, 0]).drop_columns(["file_no"])
    table = table.append_column("trans_ind", pa.array(trails.transaction_indicators(
        [table.column("csn").to_numpy()]), pa.int8()))
    table = table.append_column("rba", pa.array(range(len(table)), pa.int64()))
    table = trails.with_copy_lines(trails.with_table_versions(table, {}), layouts).select(trails.COLUMNS)

    def write_version_3(path, records):
        meta = {"format_version": 3, "group": "EXT1", "trail": "lt", "seqno": 1, "records": len(table),
                "first_csn": "10@1:1:10", "last_csn": "11@1:1:11", "log_bsn": 5,
                "content_sha256": trails._content_digest(table, 3, layouts)}
        pq.write_table(records.replace_schema_metadata({b"trailbound.trail": json.dumps(meta).encode()}), path)

    path = tmp_path / "lt000000001"
    write_version_3(path, table)
    read = trails.read_file(path)
    assert read["copy_line"].to_pylist() == ["1\n"] * 4 and trails.copy_line_layouts(read) == layouts
    assert read.select(["rba", "trans_ind", "after"]).equals(table.select(["rba", "trans_ind", "after"]))

    changed = table.set_column(table.schema.get_field_index("after"), "after", pa.array(['{"k": 2}'] * 4))
    write_version_3(path, changed)
    with pytest.raises(TrailboundError, match="content checksum does not match"):
        trails.read_file(path)


def test_copy_lines_are_made_row_group_by_row_group(tmp_path, monkeypatch):
    """A table whose inserted image does not parse into its layout loses its lines in
    that row group only: the writer has written the earlier ones when it meets it. The
    file still names the layout, and reads back with its digest."""
    monkeypatch.setattr(trails, "FIRST_ROW_GROUP_RECORDS", 2)
    monkeypatch.setattr(trails, "ROW_GROUP_RECORDS", 2)
    table = _records([(10, 2), (11, 2)], [0, 0])
    after = table.column("after").to_pylist()
    after[3] = '{"k": "not a number"}'
    table = table.set_column(table.schema.get_field_index("after"), "after", pa.array(after, pa.string()))
    (info,) = trails.write_planned_files(tmp_path / "lt", 1, table.to_batches(max_chunksize=3), group="EXT1",
                                        log_bsn=Scn(5), layouts={"s.t": (("k", "integer"),)})
    read = trails.read_file(info.path)
    assert read["copy_line"].to_pylist() == ["1\n", "1\n", None, None]
    assert trails.copy_line_layouts(read) == {"s.t": (("k", "integer"),)}
