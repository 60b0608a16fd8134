"""One compare of a live PostgreSQL source's tables with a replicat's target tables.

1. Plan: the source's tables from defs.json (filtered by --table), mapped through the
   replicat's MAP rules to target tables (the target's catalog must have their columns);
   key ranges planned on the source by the planner it shares with the initial load
   (trailbound/keyranges.py: this driver alone plans, not the Spark tasks).
2. One Spark task per range (sides.check_range): both sides' digests, rows only where
   they differ.
3. Confirm (confirm.py): differences are re-checked once the replicat has applied past
   where they were read; the previous run's in-flight rows whose source is unchanged
   keep their older position, so a later compare confirms them.
4. Results: per table and per row in the metadata store, and a report file (JSON and
   text) under the report directory.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg2

from trailbound.compare import confirm as confirming
from trailbound.compare import sides
from trailbound.compare.sides import RangeTask, RowDifference, TableSpec
from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.metadata import dsn_from_env
from trailbound.positions import Scn
from trailbound.replicat import discards
from trailbound.replicat.checkpoint_table import CheckpointTableName
from trailbound import keyranges

REPORT_DIR = Path("var/compare")
DEFAULT_WAIT_SECONDS = 300.0
DEFAULT_CHUNK_ROWS = 50_000


@dataclass
class TableResult:
    spec: TableSpec
    ranges: int
    ranges_differing: int
    rows_compared: int
    out_of_sync: list[RowDifference] = field(default_factory=list)
    in_flight: list[RowDifference] = field(default_factory=list)

    def _count(self, kind: str) -> int:
        return sum(d.count() for d in self.out_of_sync if d.kind() == kind)

    @property
    def missing(self) -> int:
        return self._count("missing")

    @property
    def extra(self) -> int:
        return self._count("extra")

    @property
    def different(self) -> int:
        return self._count("different")

    @property
    def out_of_sync_rows(self) -> int:
        return sum(d.count() for d in self.out_of_sync)

    @property
    def in_flight_rows(self) -> int:
        return sum(d.count() for d in self.in_flight)

    @property
    def in_sync(self) -> int:
        return self.rows_compared - self.out_of_sync_rows - self.in_flight_rows

    def figures(self) -> dict:
        return {"source_table": self.spec.source, "target_table": self.spec.target, "ranges": self.ranges,
                "ranges_differing": self.ranges_differing, "rows_compared": self.rows_compared,
                "in_sync": self.in_sync, "out_of_sync": self.out_of_sync_rows, "missing": self.missing,
                "extra": self.extra, "different": self.different, "in_flight": self.in_flight_rows}


def _key_dict(spec: TableSpec, key: tuple) -> dict:
    names = spec.columns if spec.keyless else spec.key
    return dict(zip(names, key))


def _row_json(spec: TableSpec, d: RowDifference, kind: str) -> dict:
    return {"kind": kind, "key": _key_dict(spec, d.key), "columns": d.columns(spec.columns),
            "source": list(d.source) if isinstance(d.source, tuple) else d.source,
            "target": list(d.target) if isinstance(d.target, tuple) else d.target,
            "read_at": confirming.lsn_text(d.lsn), "read_at_scn": d.lsn.value}


@dataclass
class CompareReport:
    run_id: int
    source: str
    replicat: str
    pattern: str
    started_at: datetime
    ended_at: datetime
    applied: Scn
    rounds: int
    tables: list[TableResult]
    note: str | None
    report_file: Path
    # The replicat's discarded operations not reapplied, per target table compared: a
    # difference there may be one of them (replicat/discards.py).
    discarded: dict[str, int] = field(default_factory=dict)

    @property
    def out_of_sync(self) -> int:
        return sum(t.out_of_sync_rows for t in self.tables)

    @property
    def in_flight(self) -> int:
        return sum(t.in_flight_rows for t in self.tables)

    @property
    def rows_compared(self) -> int:
        return sum(t.rows_compared for t in self.tables)

    def as_json(self) -> dict:
        return {"run_id": self.run_id, "source": self.source, "replicat": self.replicat, "table": self.pattern,
                "started_at": self.started_at.isoformat(), "ended_at": self.ended_at.isoformat(),
                "applied_through": confirming.lsn_text(self.applied), "applied_through_scn": self.applied.value,
                "confirm_rounds": self.rounds, "rows_compared": self.rows_compared,
                "out_of_sync": self.out_of_sync, "in_flight": self.in_flight, "note": self.note,
                "tables": [{**t.figures(), "discards_outstanding": self.discarded.get(t.spec.target, 0),
                            "rows": [_row_json(t.spec, d, d.kind()) for d in t.out_of_sync]
                            + [_row_json(t.spec, d, "in_flight") for d in t.in_flight]} for t in self.tables]}

    def describe(self, *, rows_shown: int = 50) -> str:
        verdict = "IN SYNC" if self.out_of_sync == 0 else f"OUT OF SYNC: {self.out_of_sync} row(s)"
        lines = [f"COMPARE {self.source} -> replicat {self.replicat} (run {self.run_id}), tables {self.pattern}: "
                 f"{verdict}" + (f", {self.in_flight} row(s) in flight" if self.in_flight else ""),
                 f"  {self.rows_compared} row(s) compared; the replicat had applied through "
                 f"{confirming.lsn_text(self.applied)} (scn {self.applied}); {self.rounds} confirm round(s); "
                 f"{(self.ended_at - self.started_at).total_seconds():.1f} s",
                 "",
                 f"  {'source table':<28} {'target table':<28} {'compared':>9} {'in sync':>9} {'out of sync':>11} "
                 f"{'missing':>8} {'extra':>6} {'different':>9} {'in flight':>9}"]
        for t in self.tables:
            lines.append(f"  {t.spec.source:<28} {t.spec.target:<28} {t.rows_compared:>9} {t.in_sync:>9} "
                         f"{t.out_of_sync_rows:>11} {t.missing:>8} {t.extra:>6} {t.different:>9} "
                         f"{t.in_flight_rows:>9}")
        for t in self.tables:
            shown = [(d, d.kind()) for d in t.out_of_sync] + [(d, "in_flight") for d in t.in_flight]
            if not shown:
                continue
            lines += ["", f"  {t.spec.source} -> {t.spec.target}:"]
            for d, kind in shown[:rows_shown]:
                key = ", ".join(f"{name}={'NULL' if value is None else value}" for name, value in _key_dict(t.spec, d.key).items())
                label = {"missing": "missing in target", "extra": "extra in target", "different": "different",
                         "in_flight": "in flight"}[kind]
                times = f" x{d.count()}" if d.count() > 1 else ""
                what = f": {', '.join(d.columns(t.spec.columns))}" if kind == "different" else ""
                lines.append(f"    {label:<18} {key}{times}{what}")
            if len(shown) > rows_shown:
                lines.append(f"    ... {len(shown) - rows_shown} more in {self.report_file}")
        for t in self.tables:
            if self.discarded.get(t.spec.target):
                lines += ["", f"  {self.discarded[t.spec.target]} discarded operation(s) outstanding on {t.spec.target}: "
                              f"replicat {self.replicat} set them aside (REPERROR); differences there may be them "
                              f"(`trailbound discards {self.replicat} --table {t.spec.target}`, then --reapply)"]
        if self.note:
            lines += ["", f"  NOTE {self.note}"]
        lines += ["", f"  Report: {self.report_file} (and {self.report_file.with_suffix('.txt').name})"]
        return "\n".join(lines)


def _specs(config: Config, source: str, group: str, pattern: str, target_connection) -> list[TableSpec]:
    from trailbound.archive.contract import split_table_name
    from trailbound.archive.segments import load_defs
    from trailbound.replicat import target

    defs = load_defs(config.archive_dir(source))
    chosen = {name: table for name, table in defs.items() if fnmatch.fnmatchcase(name, pattern)}
    if not chosen:
        raise TrailboundError(f"no table of source {source} matches --table {pattern} (its tables: "
                              f"{', '.join(sorted(defs)) or 'none'})")
    with target_connection.cursor() as cur:
        plans = target.plan_tables(cur, chosen, config.replicat(group).map)
    specs = [TableSpec(name, split_table_name(name), (plan.schema, plan.name), plan.columns,
                       () if plan.keyless else plan.key, plan.keyless)
             for name, plan in sorted(plans.items()) if plan is not None]
    if not specs:
        raise TrailboundError(f"replicat {group} maps none of the tables matching {pattern} to a target table")
    return specs


def _plan_ranges(source_connection, specs: list[TableSpec], chunk_rows: int) -> dict[str, list[keyranges.KeyRange]]:
    """The load's planner on the source's key (the ranges are open at both ends, so a
    target row beyond the source's last key is still compared). A table without a key
    is one range: its rows are compared as a multiset."""
    planned = {}
    with source_connection.cursor() as cur:
        for spec in specs:
            try:
                planned[spec.source] = ([keyranges.KeyRange(None, None)] if spec.keyless else
                                        keyranges.plan(cur, *spec.source_rel, list(spec.key), chunk_rows))
            except psycopg2.Error as exc:
                raise TrailboundError(f"source table {spec.source}: {' '.join(str(exc).split())}") from None
    return planned


def _run_tasks(spark, tasks: list[RangeTask]) -> list[sides.RangeResult]:
    if spark is None:  # a caller without Spark (a quick check of a few small tables)
        return [sides.check_range(task) for task in tasks]
    try:
        from trailbound.spark import run_tasks

        return run_tasks(spark, sides.check_range, tasks)
    except Exception as exc:  # Py4JJavaError carries the Python traceback of the failed task
        text = str(exc)
        cause = next((line for line in reversed(text.splitlines()) if "Error" in line), text.splitlines()[0])
        raise TrailboundError(f"a compare task failed: {cause.strip()}") from None


def _previous_in_flight(store, group: str, specs: dict[str, TableSpec]) -> dict[tuple[str, tuple], tuple]:
    """(table, key) -> (source image, position, source version) of the last run's in-flight rows."""
    with store.transaction() as cur:
        cur.execute("SELECT r.source_table, r.key, r.source_image, r.read_at, r.source_version"
                    " FROM trailbound.compare_row r"
                    " WHERE r.kind = 'in_flight' AND r.run_id = (SELECT max(run_id) FROM trailbound.compare_run"
                    " WHERE replicat = %s)", (group,))
        rows = cur.fetchall()
    image = lambda value: tuple(value) if isinstance(value, list) else value  # noqa: E731
    found = {}
    for r in rows:
        spec = specs.get(r["source_table"])
        names = spec and (spec.columns if spec.keyless else spec.key)
        if names and set(names) == set(r["key"]):  # jsonb keeps no key order: the spec's order
            found[(spec.source, tuple(r["key"][n] for n in names))] = (image(r["source_image"]), Scn(r["read_at"]),
                                                                       r["source_version"])
    return found


def _save(store, report: CompareReport) -> None:
    with store.transaction() as cur:
        cur.execute("INSERT INTO trailbound.compare_run (run_id, source, replicat, table_pattern, started_at,"
                    " ended_at, applied_through, rounds, rows_compared, out_of_sync, in_flight, note, report_file)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (report.run_id, report.source, report.replicat, report.pattern, report.started_at,
                     report.ended_at, report.applied.value, report.rounds, report.rows_compared, report.out_of_sync,
                     report.in_flight, report.note, str(report.report_file)))
        for t in report.tables:
            f = t.figures()
            cur.execute("INSERT INTO trailbound.compare_table (run_id, source_table, target_table, ranges,"
                        " ranges_differing, rows_compared, in_sync, missing, extra, different, in_flight)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (report.run_id, f["source_table"], f["target_table"], f["ranges"], f["ranges_differing"],
                         f["rows_compared"], f["in_sync"], f["missing"], f["extra"], f["different"], f["in_flight"]))
            rows = [(d, d.kind()) for d in t.out_of_sync] + [(d, "in_flight") for d in t.in_flight]
            cur.executemany(
                "INSERT INTO trailbound.compare_row (run_id, source_table, kind, key, columns, source_image,"
                " target_image, read_at, source_version) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(report.run_id, t.spec.source, kind, json.dumps(_key_dict(t.spec, d.key)),
                  d.columns(t.spec.columns) or None, json.dumps(d.source), json.dumps(d.target), d.lsn.value,
                  d.source_version)
                 for d, kind in rows])


def _write_files(report: CompareReport) -> None:
    path = report.report_file
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, text in ((path, json.dumps(report.as_json(), indent=1, ensure_ascii=False) + "\n"),
                         (path.with_suffix(".txt"), report.describe(rows_shown=10 ** 9) + "\n")):
        partial = target.with_name(target.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(target)


def outstanding_discards(config: Config, group: str, target_connection, targets: set[str]) -> dict[str, int]:
    """The replicat's discarded operations not reapplied, per target table among `targets`."""
    name = CheckpointTableName.parse(config.replicat(group).checkpointtable)
    with target_connection.cursor() as cur:
        found = discards.outstanding(cur, name, group)
    return {table: n for table, n in found.items() if table in targets}


def resolve(config: Config, source: str, replicat: str) -> tuple[str, str]:
    """(source, replicat) as configured; refused unless the replicat applies that source
    and the source is a live PostgreSQL one."""
    group = config.replicat_name(replicat)
    source = config.source_name(source)
    applies = config.source_name(config.replicat(group).source)
    if applies != source:
        raise TrailboundError(f"replicat {group} applies source {applies}, not {source}")
    config.postgres(source)
    return source, group


def compare(spark, store, config: Config, source: str, replicat: str, *, pattern: str = "*",
            chunk_rows: int = DEFAULT_CHUNK_ROWS, wait_seconds: float = DEFAULT_WAIT_SECONDS,
            catch_up: Callable[[], None] | None = None, report_dir: Path | None = None,
            source_dsn: str | None = None, target_dsn: str | None = None) -> CompareReport:
    """Compare a source's tables (matching `pattern`, schema.table with * and ?) with the
    target tables replicat `replicat` maps them to. See the module's docstring."""
    started = datetime.now(UTC)
    source, group = resolve(config, source, replicat)
    pg = config.postgres(source)
    source_dsn = source_dsn or dsn_from_env(pg.dsn_env)
    target_dsn = target_dsn or dsn_from_env(config.target.dsn_env)
    if chunk_rows < 1:
        raise TrailboundError(f"--chunk-rows {chunk_rows}: a range holds at least one row")

    target_connection = sides.connect(target_dsn, "the target")
    try:
        source_connection = sides.connect(source_dsn, f"source {source}")
    except TrailboundError:
        target_connection.close()
        raise
    try:
        specs = _specs(config, source, group, pattern, target_connection)
        planned = _plan_ranges(source_connection, specs, chunk_rows)
        tasks = [RangeTask(spec, index, bounds, source_dsn, target_dsn)
                 for spec in specs for index, bounds in enumerate(planned[spec.source])]
        results = _run_tasks(spark, tasks)

        by_name = {spec.source: spec for spec in specs}
        earlier = _previous_in_flight(store, group, by_name)
        found: list[RowDifference] = []
        for result in results:
            for d in result.differences:
                before = earlier.get((d.table, d.key))
                if (before is not None and before[0] == d.source and before[1] < d.lsn
                        and before[2] == d.source_version):
                    d.lsn = before[1]  # unchanged since the last run read it: confirmable from there
                    # (the same version, not only the same image: a row changed and changed
                    # back between two compares shows its old image again)
                found.append(d)
        outcome = confirming.confirm(
            found, by_name, source_connection, target_connection,
            lambda: confirming.applied_through(store, config, group, target_connection),
            wait_seconds=wait_seconds, catch_up=catch_up)
        discarded = outstanding_discards(config, group, target_connection, {spec.target for spec in specs})
    finally:
        source_connection.close()
        target_connection.close()

    tables = []
    for spec in specs:
        mine = [r for r in results if r.table == spec.source]
        tables.append(TableResult(spec, len(mine), sum(not r.same for r in mine), sum(r.rows_compared for r in mine),
                                  [d for d in outcome.confirmed if d.table == spec.source],
                                  [d for d in outcome.in_flight if d.table == spec.source]))
    with store.transaction() as cur:
        cur.execute("SELECT nextval(pg_get_serial_sequence('trailbound.compare_run', 'run_id'))")
        run_id = cur.fetchone()["nextval"]
    directory = report_dir or config.path(REPORT_DIR)
    report = CompareReport(run_id, source, group, pattern, started, datetime.now(UTC), outcome.applied,
                           outcome.rounds, tables, outcome.note,
                           Path(directory) / f"compare_{source.lower()}_{group.lower()}_{run_id:06d}.json", discarded)
    _save(store, report)
    _write_files(report)
    return report
