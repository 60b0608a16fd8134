"""The data-quality checks (trailbound.quality) on trail files written here, good and bad:
a wrong trail fails the check, naming what is wrong, and Great Expectations, which the
check calls on a failure, gives the same verdict per expectation."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq

from trailbound import quality
from trailbound.archive.segments import Segment
from trailbound.positions import Scn
from trailbound.trail import format as trails

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _trail(csns: list[int], indicators: list[int], src_rbas: list[int] | None = None) -> pa.Table:
    """Trail records, one per csn (one transaction per distinct csn, in the order given)."""
    rows = [{"rba": i, "trans_ind": ind, "csn": csn, "csn_thread": 1, "csn_sequence": 1, "csn_rba": csn,
             "xid": f"x{csn}", "commit_ts": T0, "op": "INSERT", "table": "s.t", "before": None,
             "after": '{"k": 1}', "src_thread": 1, "src_sequence": 1,
             "src_rba": (src_rbas or [csn * 10 + i for i in range(len(csns))])[i], "src_scn": csn, "log_bsn": 5}
            for i, (csn, ind) in enumerate(zip(csns, indicators))]
    fields = [f for f in trails.SCHEMA if f.name in rows[0]]
    return pa.Table.from_pylist(rows, pa.schema(fields))


def _segment(path, rolled_back: list[str]) -> Segment:
    """An archived segment holding a ROLLBACK of each of `rolled_back` (top level)."""
    pq.write_table(pa.table({"xid": rolled_back, "parent_xid": pa.nulls(len(rolled_back), pa.string()),
                             "op": ["ROLLBACK"] * len(rolled_back)}), path)
    return Segment(1, 1, Scn(1), Scn(100), T0, T0, len(rolled_back), 0, "", "parquet", path)


def _check(tmp_path, *tables: pa.Table, rolled_back: list[str] = ()) -> quality.QualityReport:
    files = [trails.write_file(tmp_path / "lt", seqno, table, group="EXT1", log_bsn=Scn(5)).path
             for seqno, table in enumerate(tables)]
    return quality.validate_trail_files(files, [_segment(tmp_path / "seg.parquet", list(rolled_back))])


def _bad(report: quality.QualityReport) -> list[str]:
    return [name for name, ok in report.expectations if not ok]


def test_a_good_trail_passes_and_each_kind_of_wrong_trail_fails_naming_what_is_wrong(tmp_path):
    B, M, E, W = trails.BEGIN, trails.MIDDLE, trails.END, trails.WHOLE
    good = _check(tmp_path / "good", _trail([10, 10, 10, 11], [B, M, E, W]), _trail([12, 12], [B, E]),
                  rolled_back=["x99"])
    assert good.success and not _bad(good) and len(good.expectations) == 6, good.describe()
    assert good.describe().startswith("PASSED: 6 records in ") and not good.great_expectations

    # A transaction written before one that committed earlier, across two files.
    backwards = _check(tmp_path / "csn", _trail([12, 12], [B, E]), _trail([11], [W]))
    assert not backwards.success
    assert _bad(backwards) == ["expect_column_values_to_be_increasing(csn)",
                               "expect_column_values_to_be_in_set(in_commit_order)"], backwards.describe()
    # Within one transaction, records out of their log order.
    shuffled = _check(tmp_path / "rba", _trail([10, 10, 10], [B, M, E], src_rbas=[100, 300, 200]))
    assert _bad(shuffled) == ["expect_column_values_to_be_in_set(in_commit_order)"], shuffled.describe()
    # A transaction without its END, and an indicator no trail has.
    unended = _check(tmp_path / "ind", _trail([10, 10, 11], [B, M, W]), _trail([12], [7]))
    assert _bad(unended) == ["expect_column_values_to_be_in_set(trans_ind)",
                             "expect_column_values_to_be_in_set(indicator_well_formed)"], unended.describe()
    # A transaction the archive shows rolled back.
    rolled_back = _check(tmp_path / "rb", _trail([10, 11], [W, W]), rolled_back=["x11"])
    assert _bad(rolled_back) == ["expect_column_values_to_not_be_in_set(xid)"], rolled_back.describe()

    # Great Expectations, run on each failure, agrees on every expectation.
    for report in (backwards, shuffled, unended, rolled_back):
        text = report.describe()
        assert text.startswith("FAILED: ") and "Great Expectations on the same table:" in text, text
        assert [line.split(":")[0].removeprefix("BAD ") for line in report.great_expectations
                if line.startswith("BAD")] == _bad(report), text
    assert "1 unexpected, e.g. ['x11']" in rolled_back.describe()


def test_the_arrow_evaluation_means_what_great_expectations_means(tmp_path):
    """Missing values, empty tables, row counts and column pairs: on each table, the
    expectations' verdicts are Great Expectations' own."""
    E = quality.Expectation
    cases = [
        (pa.table({"a": pa.array([1, None, 3], pa.int64()), "b": pa.array([1, None, 3], pa.int64())}),
         [E("expect_column_values_to_be_in_set", {"column": "a", "value_set": [1, 3]}),
          E("expect_column_values_to_not_be_in_set", {"column": "a", "value_set": [2]}),
          E("expect_column_values_to_be_increasing", {"column": "a", "strictly": True}),
          E("expect_column_pair_values_to_be_equal", {"column_A": "a", "column_B": "b"}),
          E("expect_table_row_count_to_equal", {"value": 3})]),
        (pa.table({"a": pa.array([2, 2, 1], pa.int64()), "b": pa.array(["x", None, "y"]),
                   "c": pa.array(["x", "z", "y"])}),
         [E("expect_column_values_to_be_in_set", {"column": "a", "value_set": [2]}),
          E("expect_column_values_to_not_be_in_set", {"column": "b", "value_set": ["y"]}),
          E("expect_column_values_to_be_increasing", {"column": "a", "strictly": False}),
          E("expect_column_pair_values_to_be_equal", {"column_A": "b", "column_B": "c"}),
          E("expect_table_row_count_to_equal", {"value": 2})]),
        (pa.table({"a": pa.array([], pa.int64())}),
         [E("expect_column_values_to_be_in_set", {"column": "a", "value_set": [0]}),
          E("expect_table_row_count_to_equal", {"value": 0})]),
    ]
    verdicts = []
    for table, expectations in cases:
        ours = [f"{'ok ' if quality._unexpected(table, e) == 0 else 'BAD'} {e.name}" for e in expectations]
        theirs = [line.split(":")[0] for line in quality.great_expectations_result(table, expectations)]
        assert ours == theirs
        verdicts.append([line[:3] for line in ours])
    # Not a table of all-passes: the second case breaks every expectation.
    assert verdicts == [["ok "] * 5, ["BAD"] * 5, ["ok "] * 2]
