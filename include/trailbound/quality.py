"""Data-quality checks with Great Expectations: new trail files after a capture run, and
the replica after a replicat run (validate_replica, against replicat/expected.py, or for a
live PostgreSQL source a compare with the source itself: validate_compare).

The checks a user relies on, as expectations on the trail's records:
- commit order: CSNs never decrease, and no record sorts before the one above it by
  (csn, csn_thread, csn_sequence, csn_rba, src_sequence, src_rba);
- transaction indicators are well formed: 0 (1...) 2 or a lone 3, per transaction;
- no record belongs to a transaction the archive shows rolled back;
- the record count equals what the files' own metadata says.
The Airflow capture DAG runs this after each run (the engine stays Airflow-free).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trailbound.trail import format as trail
from trailbound.archive.segments import Segment
from trailbound.positions import CSN_COLUMNS, TRAIL_ORDER

log = logging.getLogger(__name__)
_ORDER = list(TRAIL_ORDER)


@dataclass
class QualityReport:
    success: bool
    checked: str
    expectations: list[tuple[str, bool]] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"{'PASSED' if self.success else 'FAILED'}: {self.checked}"]
        lines += [f"  {'ok ' if ok else 'BAD'} {name}" for name, ok in self.expectations]
        return "\n".join(lines)


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


def _indicators_ok(frame: pd.DataFrame) -> pd.Series:
    """Per record: does its indicator fit its neighbours within the transaction?"""
    key = frame[list(CSN_COLUMNS)].astype("int64")
    same_as_previous = (key == key.shift(1)).all(axis=1)
    same_as_next = (key == key.shift(-1)).all(axis=1)
    first, last = ~same_as_previous, ~same_as_next
    expected = pd.Series(1, index=frame.index)
    expected[first & ~last] = trail.BEGIN
    expected[~first & last] = trail.END
    expected[first & last] = trail.WHOLE
    return frame["trans_ind"].astype("int64") == expected


def _in_order(frame: pd.DataFrame) -> pd.Series:
    keys = list(frame[_ORDER].astype("int64").itertuples(index=False, name=None))
    return pd.Series([True] + [a <= b for a, b in zip(keys, keys[1:])], index=frame.index)


def validate_trail_files(files: list[Path], segments: list[Segment]) -> QualityReport:
    """Validate trail files (in seqno order) with Great Expectations."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    if not files:
        return QualityReport(True, "no new trail files")
    tables = [trail.read_file(path) for path in files]
    expected_count = sum(trail.read_metadata(path)["records"] for path in files)
    frame = pd.concat([t.to_pandas() for t in tables], ignore_index=True)
    frame["in_commit_order"] = _in_order(frame)
    frame["indicator_well_formed"] = _indicators_ok(frame)

    context = _context()
    batch = (context.data_sources.add_pandas("trail").add_dataframe_asset(name="records")
             .add_batch_definition_whole_dataframe("new files").get_batch(batch_parameters={"dataframe": frame}))
    suite = context.suites.add(gx.ExpectationSuite(name="trail"))
    expectations = [
        gx.expectations.ExpectColumnValuesToBeIncreasing(column="csn", strictly=False),
        gx.expectations.ExpectColumnValuesToBeInSet(column="in_commit_order", value_set=[True]),
        gx.expectations.ExpectColumnValuesToBeInSet(column="trans_ind", value_set=[0, 1, 2, 3]),
        gx.expectations.ExpectColumnValuesToBeInSet(column="indicator_well_formed", value_set=[True]),
        gx.expectations.ExpectColumnValuesToNotBeInSet(column="xid", value_set=sorted(rolled_back_xids(segments))),
        gx.expectations.ExpectTableRowCountToEqual(value=expected_count),
    ]
    for expectation in expectations:
        suite.add_expectation(expectation)
    result = batch.validate(suite)
    report = QualityReport(bool(result.success), f"{len(frame)} records in {', '.join(p.name for p in files)}",
                           [(r.expectation_config.type + _column(r.expectation_config), bool(r.success))
                            for r in result.results])
    log.info(report.describe())
    return report



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

def _context():
    """An in-memory Great Expectations context without progress bars: they would fill
    task logs with carriage-return noise."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def _column(config) -> str:
    kwargs = config.kwargs
    columns = [kwargs[k] for k in ("column", "column_A", "column_B") if kwargs.get(k)]
    return f"({', '.join(columns)})" if columns else ""


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
    """Great Expectations on a compare's figures (compare/run.py), per target table: no
    row missing, extra or different once confirmed. Rows still in flight (the replicat
    was not past them) are named in the description and do not fail the check; a later
    compare confirms them."""
    import great_expectations as gx

    frame = pd.DataFrame([t.figures() for t in report.tables])
    context = _context()
    batch = (context.data_sources.add_pandas("compare").add_dataframe_asset(name="tables")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    suite = context.suites.add(gx.ExpectationSuite(name="compare"))
    for column in ("missing", "extra", "different"):
        suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(column=column, value_set=[0]))
    result = batch.validate(suite)
    differing = [t.spec.source for t in report.tables if t.out_of_sync_rows]
    report_text = (f"{len(report.tables)} target tables against source {report.source} (compare run {report.run_id}, "
                   f"{report.rows_compared} rows, report {report.report_file})"
                   + (f"; differing: {', '.join(differing)}" if differing else "")
                   + (f"; {report.in_flight} row(s) in flight, not confirmed yet" if report.in_flight else ""))
    checked = QualityReport(bool(result.success), report_text,
                            [(r.expectation_config.type + _column(r.expectation_config), bool(r.success))
                             for r in result.results])
    log.info(checked.describe())
    return checked


def validate_replica(config, store, group: str, *, spark=None, source_dsn: str | None = None,
                     target_dsn: str | None = None) -> QualityReport:
    """Great Expectations on the replica, per target table: the rows the expected state
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

    import great_expectations as gx

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
    frame = pd.DataFrame(results, columns=["table", "target_rows", "expected_rows", "target_md5", "expected_md5",
                                           "target_keys", "expected_keys", "gone_but_present"])
    context = _context()
    batch = (context.data_sources.add_pandas("replica").add_dataframe_asset(name="tables")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    suite = context.suites.add(gx.ExpectationSuite(name="replica"))
    for a, b in (("target_rows", "expected_rows"), ("target_md5", "expected_md5"), ("target_keys", "expected_keys")):
        suite.add_expectation(gx.expectations.ExpectColumnPairValuesToBeEqual(column_A=a, column_B=b))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(column="gone_but_present", value_set=[0]))
    result = batch.validate(suite)
    differing = [r[0] for r in results if (r[1], r[3], r[5], r[7]) != (r[2], r[4], r[6], 0)]
    targets = {r[0]: ".".join(map_name(replicat.map, r[0])) for r in results}
    differing = [f"{name} ({discarded[targets[name]]} discarded operation(s) outstanding: `trailbound discards "
                 f"{group}`)" if discarded.get(targets[name]) else name for name in differing]
    report = QualityReport(bool(result.success), f"{len(results)} target tables against {against}"
                           + (f"; differing: {', '.join(differing)}" if differing else ""),
                           [(r.expectation_config.type + _column(r.expectation_config), bool(r.success))
                            for r in result.results])
    log.info(report.describe())
    return report


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
