"""Data-quality checks: new trail files after a capture run, and the replica after a
replicat run (validate_replica, against replicat/expected.py, or for a live PostgreSQL
source a compare with the source itself: validate_compare).

The checks a user relies on, as expectations on the trail's records:
- commit order: CSNs never decrease, and no record sorts before the one above it by
  (csn, csn_thread, csn_sequence, csn_rba, src_sequence, src_rba);
- transaction indicators are well formed: 0 (1...) 2 or a lone 3, per transaction;
- no record belongs to a transaction the archive shows rolled back;
- the record count equals what the files' own metadata says.
The Airflow capture DAG runs this after each run (the engine stays Airflow-free).

Each check is a list of Great Expectations' expectations (their types and arguments),
evaluated here with Arrow: they are all simple (values in a set, increasing, two columns
equal, a row count), and importing Great Expectations costs ~10 CPU-seconds, paid by every
task process that checks, two per DAG cycle. When a check fails, Great Expectations
validates the same table with the same expectations and its result (how many values were
unexpected, a sample of them) goes into the report: failures are rare, and the verdict is
then Great Expectations' as well (tests/test_quality.py holds the two to agreeing).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trailbound.trail import format as trail
from trailbound.archive.segments import Segment
from trailbound.positions import CSN_COLUMNS, TRAIL_ORDER

log = logging.getLogger(__name__)


@dataclass
class QualityReport:
    success: bool
    checked: str
    expectations: list[tuple[str, bool]] = field(default_factory=list)
    # Great Expectations' own result on a failed check: one line per expectation.
    great_expectations: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"{'PASSED' if self.success else 'FAILED'}: {self.checked}"]
        lines += [f"  {'ok ' if ok else 'BAD'} {name}" for name, ok in self.expectations]
        if self.great_expectations:
            lines += ["  Great Expectations on the same table:"] + [f"    {line}" for line in self.great_expectations]
        return "\n".join(lines)


@dataclass(frozen=True)
class Expectation:
    """One of Great Expectations' expectations: its type (expect_column_values_to_be_in_set,
    ...) and arguments (column, value_set, ...), as Great Expectations takes them."""

    type: str
    kwargs: dict

    @property
    def name(self) -> str:
        columns = [self.kwargs[k] for k in ("column", "column_A", "column_B") if self.kwargs.get(k) is not None]
        return self.type + (f"({', '.join(columns)})" if columns else "")


def _unexpected(table: pa.Table, expectation: Expectation) -> int:
    """How many rows of `table` break `expectation` (for a row count: 1 if it does), with
    Great Expectations' meaning: a column's missing values are not checked, and a pair of
    columns both missing counts as equal."""
    kind, kwargs = expectation.type, expectation.kwargs
    if kind == "expect_table_row_count_to_equal":
        return int(table.num_rows != kwargs["value"])
    if kind == "expect_column_pair_values_to_be_equal":
        a, b = table[kwargs["column_A"]], table[kwargs["column_B"]]
        equal = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
        return table.num_rows - pc.sum(equal).as_py() if table.num_rows else 0
    column = table[kwargs["column"]].drop_null()
    if kind in ("expect_column_values_to_be_in_set", "expect_column_values_to_not_be_in_set"):
        found = pc.sum(pc.is_in(column, value_set=pa.array(kwargs["value_set"], column.type))).as_py() or 0
        return len(column) - found if kind == "expect_column_values_to_be_in_set" else found
    if kind == "expect_column_values_to_be_increasing":
        steps = np.diff(column.to_numpy())
        return int(np.count_nonzero(steps <= 0 if kwargs.get("strictly") else steps < 0))
    raise ValueError(f"no Arrow evaluation for the expectation {kind}")


def _check(table: pa.Table, expectations: list[Expectation], checked: str) -> QualityReport:
    """Evaluate `expectations` on `table`; on a failure, Great Expectations' result too."""
    results = [(expectation.name, _unexpected(table, expectation) == 0) for expectation in expectations]
    report = QualityReport(all(ok for _, ok in results), checked, results)
    if not report.success:
        report.great_expectations = great_expectations_result(table, expectations)
    log.info(report.describe())
    return report


def great_expectations_result(table: pa.Table, expectations: list[Expectation]) -> list[str]:
    """Great Expectations validates `table` with `expectations`: per expectation, a line with
    its verdict and, when it failed, how many values were unexpected and a few of them."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    context = _context()
    batch = (context.data_sources.add_pandas("checked").add_dataframe_asset(name="table")
             .add_batch_definition_whole_dataframe("whole")
             .get_batch(batch_parameters={"dataframe": table.to_pandas()}))
    suite = context.suites.add(gx.ExpectationSuite(name="check"))
    for expectation in expectations:
        # expect_column_values_to_be_in_set -> gx.expectations.ExpectColumnValuesToBeInSet
        kind = "".join(word.title() for word in expectation.type.split("_"))
        suite.add_expectation(getattr(gx.expectations, kind)(**expectation.kwargs))
    lines = []
    for result in batch.validate(suite).results:  # not in the suite's order
        config, detail = result.expectation_config, result.result or {}
        line = f"{'ok ' if result.success else 'BAD'} {Expectation(config.type, dict(config.kwargs)).name}"
        if not result.success and "unexpected_count" in detail:
            line += f": {detail['unexpected_count']} unexpected, e.g. {detail.get('partial_unexpected_list', [])[:5]}"
        elif not result.success and "observed_value" in detail:
            line += f": observed {detail['observed_value']}"
        lines.append(line)
    order = {expectation.name: n for n, expectation in enumerate(expectations)}
    return sorted(lines, key=lambda line: order.get(line[4:].split(":")[0], len(order)))


def _context():
    """An in-memory Great Expectations context without progress bars: they would fill
    task logs with carriage-return noise."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def rolled_back_xids(segments: list[Segment]) -> set[str]:
    """Top-level transactions the archive shows rolled back (reads three columns only)."""
    xids: set[str] = set()
    for segment in segments:
        if not segment.records or not segment.path.exists():
            continue
        if segment.format == "parquet":
            table = pq.read_table(segment.path, columns=["xid", "parent_xid", "op"])
        else:
            import pyarrow.json as pj

            table = pj.read_json(segment.path).select(["xid", "parent_xid", "op"])
        mask = pc.and_(pc.equal(table["op"], "ROLLBACK"), pc.is_null(table["parent_xid"]))
        xids.update(table.filter(mask)["xid"].to_pylist())
    return xids


def _same_as_previous(table: pa.Table, columns) -> np.ndarray:
    """Per record: equal to the record above it in all `columns` (the first: False)."""
    same = np.zeros(table.num_rows, dtype=bool)
    same[1:] = True
    for column in columns:
        values = table[column].to_numpy()
        same[1:] &= values[1:] == values[:-1]
    return same


def _indicators_ok(table: pa.Table) -> np.ndarray:
    """Per record: does its indicator fit its neighbours within the transaction?"""
    same_as_previous = _same_as_previous(table, CSN_COLUMNS)
    first = ~same_as_previous
    last = np.ones(table.num_rows, dtype=bool)
    last[:-1] = ~same_as_previous[1:]
    expected = np.full(table.num_rows, trail.MIDDLE)
    expected[first & ~last] = trail.BEGIN
    expected[~first & last] = trail.END
    expected[first & last] = trail.WHOLE
    return table["trans_ind"].to_numpy() == expected


def _in_commit_order(table: pa.Table) -> np.ndarray:
    """Per record: does it sort at or after the record above it by TRAIL_ORDER?"""
    before = np.zeros(max(table.num_rows - 1, 0), dtype=bool)
    equal = np.ones(max(table.num_rows - 1, 0), dtype=bool)
    for column in TRAIL_ORDER:
        values = table[column].to_numpy()
        before |= equal & (values[:-1] < values[1:])
        equal &= values[:-1] == values[1:]
    ok = np.ones(table.num_rows, dtype=bool)
    ok[1:] = before | equal
    return ok


def validate_trail_files(files: list[Path], segments: list[Segment]) -> QualityReport:
    """Validate trail files (in seqno order)."""
    if not files:
        return QualityReport(True, "no new trail files")
    columns = [*TRAIL_ORDER, "trans_ind", "xid"]
    table = pa.concat_tables([trail.read_file(path).select(columns) for path in files])
    expected_count = sum(trail.read_metadata(path)["records"] for path in files)
    table = (table.append_column("in_commit_order", pa.array(_in_commit_order(table)))
             .append_column("indicator_well_formed", pa.array(_indicators_ok(table))))
    expectations = [
        Expectation("expect_column_values_to_be_increasing", {"column": "csn", "strictly": False}),
        Expectation("expect_column_values_to_be_in_set", {"column": "in_commit_order", "value_set": [True]}),
        Expectation("expect_column_values_to_be_in_set", {"column": "trans_ind", "value_set": [0, 1, 2, 3]}),
        Expectation("expect_column_values_to_be_in_set", {"column": "indicator_well_formed", "value_set": [True]}),
        Expectation("expect_column_values_to_not_be_in_set",
                    {"column": "xid", "value_set": sorted(rolled_back_xids(segments))}),
        Expectation("expect_table_row_count_to_equal", {"value": expected_count}),
    ]
    return _check(table, expectations, f"{table.num_rows} records in {', '.join(p.name for p in files)}")


@dataclass
class TrailCheck:
    """What validate_new_trail checked: the report, the new files and the write
    checkpoint they end at (seqno:rba, and the last CSN written, when there is one)."""

    report: QualityReport
    files: list[Path]
    write_position: str
    last_csn: str | None


def validate_new_trail(store, group: str, source: str, after_seqno: int) -> TrailCheck:
    """validate_trail_files on the extract's committed trail files after `after_seqno`
    (the write checkpoint's seqno before the run), against the source's archived segments."""
    from trailbound.archive.catalog import ArchiveCatalog
    from trailbound.capture import checkpoints
    from trailbound.trail import catalog

    with store.transaction() as cur:
        state = checkpoints.load(cur, group)
        files = [Path(row["path"]) for row in catalog.committed_files(cur, str(state.exttrail))
                 if row["seqno"] > after_seqno]
    report = validate_trail_files(files, ArchiveCatalog(store, source).segments())
    return TrailCheck(report, files, str(state.write.position),
                      str(state.write.last_csn) if state.write.last_csn else None)


def _copy_text(value) -> str:
    """A truth value (contract encoding) as a COPY text field."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    else:
        text = str(value)
    return (text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r"))


def validate_compare(report) -> QualityReport:
    """Expectations on a compare's figures (compare/run.py), per target table: no
    row missing, extra or different once confirmed. Rows still in flight (the replicat
    was not past them) are named in the description and do not fail the check; a later
    compare confirms them."""
    table = pa.table({"target_table": pa.array([t.spec.target for t in report.tables], pa.string()),
                      **{column: pa.array([getattr(t, column) for t in report.tables], pa.int64())
                         for column in ("missing", "extra", "different")}})
    differing = [t.spec.source for t in report.tables if t.out_of_sync_rows]
    report_text = (f"{len(report.tables)} target tables against source {report.source} (compare run {report.run_id}, "
                   f"{report.rows_compared} rows, report {report.report_file})"
                   + (f"; differing: {', '.join(differing)}" if differing else "")
                   + (f"; {report.in_flight} row(s) in flight, not confirmed yet" if report.in_flight else ""))
    return _check(table, [Expectation("expect_column_values_to_be_in_set", {"column": column, "value_set": [0]})
                          for column in ("missing", "extra", "different")], report_text)


def validate_replica(config, store, group: str, *, spark=None, source_dsn: str | None = None,
                     target_dsn: str | None = None) -> QualityReport:
    """Expectations on the replica, per target table: the rows the expected state
    names are there with the same values (count and checksum), and the keys it says are
    gone are not. The expected state is the source's `truth` file once the replicat has
    applied through it, else the fold of the trail it applied (replicat/expected.py).
    PostgreSQL parses the expected values with the target's own types, so numeric scale,
    bytea, timestamptz and NULL vs '' all count.

    A live PostgreSQL source (`postgres:`) is compared with the target itself
    (`trailbound compare`, on `spark`, without waiting for the replicat: differences it
    is not past yet stay in flight) and checked with validate_compare. The DSNs not given
    are read from the variables the configuration names."""
    import json

    replicat = config.replicat(group)
    if config.source(replicat.source).postgres is not None:
        from trailbound.compare.run import compare

        return validate_compare(compare(spark, store, config, replicat.source, group, wait_seconds=0,
                                          source_dsn=source_dsn, target_dsn=target_dsn))

    from trailbound.archive.segments import load_defs
    from trailbound.replicat import checkpoints, discards, expected
    from trailbound.replicat.checkpoint_table import CheckpointTableName
    from trailbound.trail import catalog
    from trailbound.replicat.target import connect, map_name

    source = config.source(replicat.source)
    with store.transaction() as cur:
        state = checkpoints.load(cur, group)
        rows = catalog.committed_files(cur, state.exttrail, 1) if state else []
    if state is None or state.checkpoint.log_csn is None:
        return QualityReport(True, f"replicat {group} has applied nothing yet: nothing to compare")
    applied = state.checkpoint.log_csn
    truth = json.loads(config.path(source.truth).read_text()) if source.truth else None
    if truth is not None and truth["last_csn"] <= applied.scn:
        tables, against = expected.from_truth(truth), f"{source.truth} (complete state)"
    else:
        files = expected.readable_suffix(rows, state.checkpoint.position)
        tables = expected.from_trail(files, state.checkpoint.position, load_defs(config.archive_dir(replicat.source)))
        against = (f"the trail as applied through {applied} (files {files[0][0]}..{files[-1][0]}, keys it touched)"
                   if files else "the trail (no readable file: keys not checked)")
    results = []
    connection = connect(config, target_dsn)
    try:
        with connection.cursor() as cur:
            # Operations REPERROR set aside: the replica differs there on purpose, until reapplied.
            discarded = discards.outstanding(cur, CheckpointTableName.parse(state.checkpoint_table), group)
            for table in tables.values():
                target = map_name(replicat.map, table.name)
                if target is not None:
                    results.append(_compare_table(cur, table, target))
                    connection.rollback()  # drops the temp tables; nothing was written
    finally:
        connection.close()
    columns = {"table": pa.string(), "target_rows": pa.int64(), "expected_rows": pa.int64(),
               "target_md5": pa.string(), "expected_md5": pa.string(), "target_keys": pa.int64(),
               "expected_keys": pa.int64(), "gone_but_present": pa.int64()}
    table = pa.table({name: pa.array([r[i] for r in results], kind) for i, (name, kind) in enumerate(columns.items())})
    expectations = [Expectation("expect_column_pair_values_to_be_equal", {"column_A": a, "column_B": b})
                    for a, b in (("target_rows", "expected_rows"), ("target_md5", "expected_md5"),
                                 ("target_keys", "expected_keys"))]
    expectations.append(Expectation("expect_column_values_to_be_in_set", {"column": "gone_but_present", "value_set": [0]}))
    differing = [r[0] for r in results if (r[1], r[3], r[5], r[7]) != (r[2], r[4], r[6], 0)]
    targets = {r[0]: ".".join(map_name(replicat.map, r[0])) for r in results}
    differing = [f"{name} ({discarded[targets[name]]} discarded operation(s) outstanding: `trailbound discards "
                 f"{group}`)" if discarded.get(targets[name]) else name for name in differing]
    return _check(table, expectations, f"{len(results)} target tables against {against}"
                  + (f"; differing: {', '.join(differing)}" if differing else ""))


def _compare_table(cur, table, target: tuple[str, str]) -> tuple:
    """(name, target rows, expected rows, target md5, expected md5, target keys, expected
    keys, gone keys present) for one table. Rows and md5 cover the expected full rows
    (every row when the state is complete); keys cover the keys that must exist."""
    import io

    from psycopg2 import sql

    def load(name: str, columns, lines) -> None:
        names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        cur.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA")
                    .format(sql.Identifier(name), names, relation))
        data = "".join("\t".join(_copy_text(v) for v in line) + "\n" for line in lines)
        cur.copy_expert(sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(name), names).as_string(cur),
                        io.StringIO(data))

    def one(query, *args):
        cur.execute(query.format(*args))
        return cur.fetchone()

    relation = sql.Identifier(*target)
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in table.columns)
    load("tb_expected", table.columns, ([row[c] for c in table.columns] for row in table.rows))
    checksum = sql.SQL("SELECT count(*), md5(coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), ''))"
                       " FROM (SELECT {} FROM {} {}) r")
    expected_rows, expected_md5 = one(checksum, columns, sql.Identifier("tb_expected"), sql.SQL(""))
    if table.complete:
        target_rows, target_md5 = one(checksum, columns, relation, sql.SQL(""))
        return (table.name, target_rows, expected_rows, target_md5, expected_md5, 0, 0, 0)
    key = sql.SQL(", ").join(sql.Identifier(c) for c in table.key)
    within = sql.SQL("WHERE ({}) IN (SELECT {} FROM {})")
    target_rows, target_md5 = one(checksum, columns, relation, within.format(key, key, sql.Identifier("tb_expected")))
    load("tb_present", table.key, table.present)
    load("tb_gone", table.key, table.gone)
    count = sql.SQL("SELECT count(*) FROM {} {}")
    target_keys, = one(count, relation, within.format(key, key, sql.Identifier("tb_present")))
    gone_present, = one(count, relation, within.format(key, key, sql.Identifier("tb_gone")))
    return (table.name, target_rows, expected_rows, target_md5, expected_md5, target_keys, len(table.present),
            gone_present)
