"""The crash matrix (docs/reliability.md): every named crash point of
every stage, x 3 simulator seeds, compared with a run that was never killed.

One test per seed (so pytest-xdist spreads them) drives two homes through the same
rounds: the baseline, never killed, and the crashed one. A round is capture (until a log
time), pump, replicat, trail purge and retention. In the crashed home each stage is
first killed (`kill -9`, exit 137, a `trailbound` subprocess with TRAILBOUND_CRASH_AT)
at one crash point, run again and killed at a second, and, for some, run a third time in
process while the metadata store or the target drops its connection (pg_terminate_backend
from another session): that run must stop with one clean error line (exit 1). Then the
stage runs to the end in process and the round's state is compared with the baseline's
same round: the local and remote trail records in order, the target's rows, the checkpoint
table row (equal to the last CSN of the remote trail), the purged trail files and
archive segments. Every cell's divergence count goes into the matrix that
`pytest_terminal_summary` (tests/conftest.py) prints at the end; any divergence fails.

Parallel apply (replicat/apply/parallel.py): REP1 groups two operations at least
(GROUPTRANSOPS), so the simulator's insert-only transactions make insert-only groups
and each seed's replicat runs send about 150 of them to lanes (extra target sessions
that commit in trail order); at the 40 it had before, none went. Replicat's cells name
the thread they die on: `lane:<point>` (lane:mid_copy, lane:before_target_commit,
lane:after_target_commit) kills the run on a lane's thread, with that group (and maybe
the next, on the other lane) in flight, and fails if no group reached a lane; a bare
point kills it on the run's own thread (THREAD_PRELUDE), as before lanes existed. Each
seed also asserts that the crashed home's completed replicat runs applied at least
MIN_LANE_GROUPS groups on lanes.

Cost: only the crashing invocations are subprocesses; everything else runs on the shared
`spark` fixture. Two crashes per stage and round (replicat: up to two more, on a lane)
keep the rounds (and the baseline's runs) to two. The killed capture and replicat
processes do not each start a JVM of their own (half a minute on two loaded CPUs, and
every Spark job in it cold): they are Spark Connect clients of the worker's warm server
(`spark_remote`, through crash_kit.ConnectCrashDriver). Once a killed run is dead, what
it left on the server (its cached data, its jobs) is dropped, so every run starts from
the files and checkpoints alone, as after a machine's restart; the process itself still
dies with `kill -9`'s status at its crash point, with its database sessions. The seeds run in
`make reliability` only (see SEEDS); `make test` runs the plan check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest
from psycopg2 import sql

from crash_kit import ConnectCrashDriver
from replicat_kit import checkpoint_row, differences
from trailbound import cli
from trailbound import config as configuration
from trailbound import retention
from trailbound.archive.contract import split_table_name
from trailbound.archive.segments import TableDef, load_defs
from trailbound.capture import bounded
from trailbound.capture.run import CRASH_POINTS as CAPTURE_POINTS
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn
from trailbound.pump.run import CRASH_POINTS as PUMP_POINTS
from trailbound.pump.run import run_pump
from trailbound.replicat import target as tgt
from trailbound.replicat.run import CRASH_POINTS as REPLICAT_POINTS
from trailbound.replicat.run import run_replicat
from trailbound.trail import format as trail
from trailbound import files as trailfs
from trailbound.trail import purge as trailpurge
from trailbound.trail.purge import CRASH_POINTS as PURGE_POINTS

pytestmark = [pytest.mark.spark, pytest.mark.pg]

# The seeds run with `make reliability` (marker matrix): even one seed (about 10 minutes of
# kills and reruns) would take `make test` past its 20-minute budget on two CPUs.
SEEDS = tuple(pytest.param(seed, marks=pytest.mark.matrix) for seed in (11, 23, 37))
START = datetime(2026, 11, 1, tzinfo=timezone.utc)
HOURS = 6
# Round r reads the log archived by UNTIL[r] hours (None: all of it). At 2.5 h two of the
# simulator's long stories (annual_review from 0.48 h, bulk_import from 1.8 h; their times
# are fractions of the duration, the same for every seed) are open and older than the BR
# interval, so round 0's BR checkpoint persists two transactions and `mid_br_persist` (between
# two files) is reached whatever the seed; at 1.5 h only one was, and only seed 11's
# random short transactions made a second.
UNTIL = (2.5, None)

# The archive's schema changes (the demo's: an ADD COLUMN DEFAULT on shop.customers inside
# a transaction that writes rows of both versions, and a CREATE TABLE shop.reviews) fall
# in round 1 for every seed (the ALTER waits for customers to be free: 03:48 to 04:52 log
# time, measured): its capture writes their first records (the new_version_write points)
# and its replicat alters the target (created from the first versions) and creates the
# new table in the target transaction of their first rows (after_target_alter).
SCHEMA_CHANGES = "demo"
# Only these cells when set (comma-separated points, e.g. after_target_alter): the new
# points of a change run without the whole matrix; the rounds' stages all still run.
ONLY_ENV = "TRAILBOUND_MATRIX_POINTS"

# What each round kills, per stage, in order: (stage, crash point), or a connection drop
# (stage, "drop:<metadata|target>@<the crash point where it happens>"). A kill that
# commits (after_checkpoint_commit, after_file_commit) comes last: the next run of the
# round has nothing left to do; the others die before their commit, so the next kill in
# the same round dies in a run that recovers from the previous one.
# Replicat's points fire on the thread the cell names: "lane:<point>" only on a parallel
# apply lane's thread (apply/parallel.py: a group that only inserts, on a target session of its
# own, while the run's own thread hands out the next group), a bare point only on the
# run's own thread (its own session; the lanes' groups pass it by).
LANE = "lane:"
PLAN = {
    0: [("extract", "mid_br_persist"), ("extract", "before_trail_write"), ("extract", "after_checkpoint_commit"),
        ("pump", "mid_copy"), ("pump", "before_rename"), ("pump", "drop:metadata@after_copy"),
        ("replicat", "mid_copy"), ("replicat", "lane:before_target_commit"), ("replicat", "after_target_commit"),
        ("replicat", "lane:after_target_commit"), ("replicat", "drop:target@before_target_commit"),
        ("purge", "mid_purge"), ("retention", "retention_mid_purge")],
    1: [("extract", "after_br_persist"), ("extract", "mid_trail_write"), ("extract", "after_trail_write"),
        ("extract", "before_new_version_write"), ("extract", "after_new_version_write"),
        ("extract", "drop:metadata@after_trail_write"),
        ("pump", "after_copy"), ("pump", "after_file_commit"),
        ("replicat", "after_target_alter"), ("replicat", "before_target_commit"), ("replicat", "lane:mid_copy"), ("replicat", "between_groups"),
        ("replicat", "drop:metadata@after_target_commit"), ("replicat", "drop:target@lane:mid_copy"),
        ("purge", "mid_purge"), ("retention", "retention_after_delete")],
}
# The fewest replicat groups the crashed home's (completed) runs of one seed must have
# applied on lanes; with grouptransops 2 the seeds send 144 to 157 (measured).
MIN_LANE_GROUPS = 50
STAGES = ("extract", "pump", "replicat", "purge", "retention")
# Crash points covered elsewhere, listed in the matrix for completeness.
ELSEWHERE = {"after_segment_before_manifest": "tests/test_pg_source.py (PostgreSQL miner)",
             "after_manifest_before_confirm": "tests/test_pg_source.py (PostgreSQL miner)",
             "between_pieces": "tests/test_replicat_pieces.py (replicat, a transaction longer than chunk_records)",
             # The matrix's target refuses nothing, so no operation is ever discarded there.
             "discard_before_commit": "tests/test_reperror.py (replicat, REPERROR discard: the row not committed)",
             "discard_after_commit": "tests/test_reperror.py (replicat, REPERROR discard: committed, not in the file)"}


def test_the_plan_names_every_crash_point():
    planned = {(stage, point.removeprefix(LANE)) for cells in PLAN.values() for stage, point in cells
               if not point.startswith("drop:")}
    lanes = {(stage, point) for cells in PLAN.values() for stage, point in cells if point.startswith(LANE)}
    # between_groups is the run's own thread's (after any group's commit): no lane reaches it.
    assert lanes and {stage for stage, _ in lanes} == {"replicat"} and ("replicat", "lane:between_groups") not in lanes
    every = ({("extract", p) for p in (*CAPTURE_POINTS, *bounded.CRASH_POINTS)} | {("pump", p) for p in PUMP_POINTS}
             | {("replicat", p) for p in REPLICAT_POINTS} | {("purge", p) for p in PURGE_POINTS}
             | {("retention", p) for p in retention.CRASH_POINTS})
    assert planned == every - {("replicat", point) for point in ELSEWHERE}


# Replicat's GROUPTRANSOPS. 2: a group is one source transaction, or a few of one
# operation each, so the simulator's insert-only transactions (a new order and its
# lines, timesheets, page views, a third of them) make insert-only groups, which parallel
# apply sends to lanes (about 150 per seed), while 200 groups still hold several
# transactions. At 40 (before), a group held a dozen transactions, one of them always
# updating or deleting: no group went to a lane (one in some seeds).
GROUPTRANSOPS = 2


def _config_text(home: Path) -> str:
    return f"""home: {home}
sources:
  SRC:
    altarchivelogdest: archive
extracts:
  EXT1:
    source: SRC
    exttrail: dirdat/lt
    table: ["shop.*", "hr.*"]
    megabytes: 0.05
    interval: 20m
    br:
      brdir: brfiles
      brinterval: 20m
pumps:
  PMP1: {{exttrail: dirdat/lt, rmttrail: dirrmt/rt}}
replicats:
  REP1: {{exttrail: dirrmt/rt, source: SRC, grouptransops: {GROUPTRANSOPS}, apply_parallelism: 2}}
purgeoldextracts: {{minkeephours: 0, minkeepfiles: 1}}
retention:
  minkeephours: 0
"""


@dataclass
class Home:
    """One pipeline: its directory, metadata store and target, and what was read of its
    trails so far (files are purged as the rounds go, so they are read as they commit)."""

    directory: Path
    metadata_dsn: str
    target_dsn: str
    config_path: Path = field(init=False)
    config: configuration.Config = field(init=False)
    seen: dict[str, list] = field(default_factory=lambda: {"local": [], "remote": []})
    read_through: dict[str, int] = field(default_factory=lambda: {"local": 0, "remote": 0})

    def __post_init__(self):
        self.config_path = self.directory / "trailbound.yaml"
        self.config_path.write_text(_config_text(self.directory))
        self.config = configuration.load(self.config_path)

    def store(self) -> MetadataStore:
        return MetadataStore.open(self.metadata_dsn)

    def trail_key(self, which: str) -> str:
        return self.config.trail_location("dirdat/lt" if which == "local" else "dirrmt/rt")

    def run(self, spark, stage: str, until: datetime | None) -> None:
        with self.store() as store:
            if stage == "extract":
                run_extract(spark, store, self.config, "EXT1", until=until)
            elif stage == "pump":
                run_pump(None, store, self.config, "PMP1")
            elif stage == "replicat":
                run_replicat(spark, store, self.config, "REP1", target_dsn=self.target_dsn)
            elif stage == "purge":
                trailpurge.purge_trails(store, self.config)
            else:
                retention.run_retention(store, self.config)

    def argv(self, stage: str, until: datetime | None) -> list[str]:
        words = {"extract": ["extract", "run", "EXT1"], "pump": ["pump", "run", "PMP1"],
                 "replicat": ["replicat", "run", "REP1"], "purge": ["purge", "trails"],
                 "retention": ["retention", "run"]}[stage]
        if stage == "extract" and until is not None:
            words += ["--until", until.strftime("%Y-%m-%dT%H:%M:%S")]
        return ["--config", str(self.config_path), *words]

    def env(self) -> dict[str, str]:
        return {"TRAILBOUND_METADATA_DSN": self.metadata_dsn, "TRAILBOUND_TARGET_DSN": self.target_dsn}

    def read_new_trail_records(self) -> None:
        with self.store() as store, store.transaction() as cur:
            for which in ("local", "remote"):
                cur.execute("SELECT seqno, path, sha256 FROM trailbound.trail_file WHERE trail = %s AND seqno > %s"
                            " ORDER BY seqno", (self.trail_key(which), self.read_through[which]))
                for row in cur.fetchall():
                    records = trail.read_file(row["path"], fs=trailfs.for_location(row["path"], None),
                                              sha256=row["sha256"]).to_pylist()
                    self.seen[which] += [(row["seqno"], *(r[c] for c in trail.COLUMNS)) for r in records]
                    self.read_through[which] = row["seqno"]

    def snapshot(self, truth: dict) -> dict:
        """What a round is compared on."""
        self.read_new_trail_records()
        rows = {}
        with psycopg2.connect(self.target_dsn) as connection, connection.cursor() as cur:
            for name in truth["tables"]:
                cur.execute(sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier(*split_table_name(name))))
                rows[name] = sorted(r[0] for r in cur.fetchall())
        with self.store() as store, store.transaction() as cur:
            cur.execute("SELECT trail, seqno FROM trailbound.trail_file WHERE purged_at IS NOT NULL ORDER BY 1, 2")
            purged_files = [(r["trail"].rsplit("/", 1)[-1], r["seqno"]) for r in cur.fetchall()]
            cur.execute("SELECT thread, sequence FROM trailbound.archive_segment WHERE state = 'purged' ORDER BY 1, 2")
            purged_segments = [(r["thread"], r["sequence"]) for r in cur.fetchall()]
        row = checkpoint_row(self.target_dsn)
        return {"local": list(self.seen["local"]), "remote": list(self.seen["remote"]), "rows": rows,
                "checkpoint": (row["seqno"], row["rba"], row["log_csn"]) if row else None,
                "purged_files": purged_files, "purged_segments": purged_segments}


def _create_database(pg_server_dsn: str, name: str) -> str:
    admin = psycopg2.connect(pg_server_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    admin.close()
    return psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name)


def _drop_database(pg_server_dsn: str, name: str) -> None:
    admin = psycopg2.connect(pg_server_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()


def _terminate(dsn: str) -> int:
    """pg_terminate_backend for every other session on the database `dsn` names, from a
    session of its own: what a restarted server or a network cut does to a run."""
    dbname = psycopg2.extensions.parse_dsn(dsn)["dbname"]
    with psycopg2.connect(dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,))
        count = cur.fetchone()[0]
    connection.close()
    return count


_CRASH_MODULES = {"extract": ("trailbound.capture.run", "trailbound.capture.bounded"),
                  "pump": ("trailbound.pump.run",),
                  "replicat": ("trailbound.replicat.run", "trailbound.replicat.apply.serial",
                               "trailbound.replicat.apply.parallel", "trailbound.replicat.apply.copychain")}
# The threads apply/parallel.py's lanes run on (ThreadPoolExecutor "replicat-lane-<n>_<i>").
LANE_THREAD = "replicat-lane-"
THREAD_ENV = "TRAILBOUND_MATRIX_CRASH_THREAD"
# What a killed replicat runs before trailbound's command line: its crash points fire only
# on the thread the cell names ($TRAILBOUND_MATRIX_CRASH_THREAD: lane or main).
THREAD_PRELUDE = f"""
import os
import threading
from trailbound import crash
from trailbound.replicat import run
from trailbound.replicat.apply import copychain, parallel, serial as apply

_fire, _on_lane = crash.crashpoint, os.environ.pop({THREAD_ENV!r}) == "lane"


def _crashpoint(name):
    if threading.current_thread().name.startswith({LANE_THREAD!r}) == _on_lane:
        _fire(name)


for _module in (apply, copychain, parallel, run):
    _module.crashpoint = _crashpoint
"""


def _on_thread(point: str) -> tuple[str, bool]:
    """A replicat cell's crash point, and whether it fires on a lane's thread only."""
    return point.removeprefix(LANE), point.startswith(LANE)


def _on_a_lane() -> bool:
    return threading.current_thread().name.startswith(LANE_THREAD)


def _drop_connection(home: Home, stage: str, spec: str, until, capsys, monkeypatch) -> list[str]:
    """Run `stage` through the CLI in process; at crash point `point` the metadata store
    or the target loses its connections. Returns what went wrong (empty: a clean error)."""
    database, point = spec.removeprefix("drop:").split("@")
    point, on_lane = _on_thread(point)
    dropped = []

    def hook(name: str) -> None:
        if name == point and not dropped and (stage != "replicat" or _on_a_lane() == on_lane):
            dropped.append(_terminate(home.metadata_dsn if database == "metadata" else home.target_dsn))

    with monkeypatch.context() as patch:
        for module in _CRASH_MODULES[stage]:
            patch.setattr(f"{module}.crashpoint", hook)
        for key, value in home.env().items():
            patch.setenv(key, value)
        capsys.readouterr()
        status = cli.main(home.argv(stage, until))
        out, err = capsys.readouterr()
    problems = []
    if not dropped or not dropped[0]:
        problems.append(f"{spec}: the run never reached {point} or no session was there to drop")
    if status != 1:
        problems.append(f"{spec}: exit status {status}, not 1")
    lines = err.strip().splitlines()
    if len(lines) != 1 or not lines[0].startswith("ERROR "):
        problems.append(f"{spec}: stderr is not one ERROR line: {err.strip()[-1500:]!r}")
    return problems


def _br_files(home: Home) -> set[Path]:
    brdir = home.directory / "brfiles" / "EXT1"
    return set(brdir.glob("*.parquet")) if brdir.is_dir() else set()


def _crash(home: Home, stage: str, point: str, until, driver: ConnectCrashDriver) -> list[str]:
    """Kill `stage` at `point` (a subprocess), and check that the cell means something."""
    br_before = _br_files(home)
    env = {**os.environ, **home.env(), CRASH_ENV: point}
    if stage == "replicat":  # on the worker's Connect server, killed on the thread the cell names
        name, on_lane = _on_thread(point)
        command = driver.cli(*home.argv(stage, until), prelude=THREAD_PRELUDE)
        env.update(driver.env)
        env.update({CRASH_ENV: name, THREAD_ENV: "lane" if on_lane else "main"})
    elif stage == "extract":  # the other Spark stage: on the worker's Connect server
        command = driver.cli(*home.argv(stage, until))
        env.update(driver.env)
    else:
        command = [sys.executable, "-m", "trailbound.cli", *home.argv(stage, until)]
    crashed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if crashed.returncode != 137:
        return [f"{stage} {point}: exit status {crashed.returncode}, not 137 (the point was never reached"
                f"{' on a lane: no group went to one' if point.startswith(LANE) else ''}): "
                f"{crashed.stderr.strip()[-1500:]}"]
    # The cells that need a particular state to mean anything: a BR cell must have written
    # new BR files, a mid-write cell must have left a trail file past the checkpoint.
    if point in ("mid_br_persist", "after_br_persist") and not _br_files(home) - br_before:
        return [f"{stage} {point}: no BR file was written (the cell would repeat another)"]
    if point == "mid_trail_write":
        with home.store() as store, store.transaction() as cur:
            cur.execute("SELECT coalesce(max(seqno), 0) AS n FROM trailbound.trail_file WHERE trail = %s",
                        (home.trail_key("local"),))
            last = cur.fetchone()["n"]
        past = [p for p in trail.existing_files(Path(home.trail_key("local"))) if int(p.name[-9:]) > last]
        if not past:
            return [f"{stage} {point}: no uncommitted trail file was left"]
    return []


def _divergences(crashed: dict, baseline: dict) -> list[str]:
    found = []
    for which in ("local", "remote"):
        a, b = crashed[which], baseline[which]
        differing = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
        if differing:
            found.append(f"{which} trail: {differing} record(s) differ ({len(a)} vs {len(b)} in the baseline)")
    for table, rows in baseline["rows"].items():
        mine = crashed["rows"][table]
        extra, missing = sorted(set(mine) - set(rows)), sorted(set(rows) - set(mine))
        extra += ["(duplicate)"] * (len(mine) - len(set(mine)))
        if extra or missing:
            found.append(f"target {table}: {len(extra)} extra, {len(missing)} missing row(s): {extra[:1]} {missing[:1]}")
    for key in ("checkpoint", "purged_files", "purged_segments"):
        if crashed[key] != baseline[key]:
            found.append(f"{key}: {crashed[key]} vs {baseline[key]} in the baseline")
    remote = crashed["remote"]
    if remote and crashed["checkpoint"] is not None:
        last_csn = str(Csn.from_row(dict(zip(("seqno", *trail.COLUMNS), remote[-1]))))
        if crashed["checkpoint"][2] != last_csn:
            found.append(f"checkpoint table log_csn {crashed['checkpoint'][2]} is not the last applied CSN {last_csn}")
    return found


def _transactions(records: list[tuple]) -> list[tuple[str, int]]:
    """(xid, csn) of each transaction, in trail order."""
    ind, xid, csn = trail.COLUMNS.index("trans_ind") + 1, trail.COLUMNS.index("xid") + 1, trail.COLUMNS.index("csn") + 1
    return [(r[xid], r[csn]) for r in records if r[ind] in (trail.BEGIN, trail.WHOLE)]


# Each seed kills Spark jobs ten times and runs them to the end a dozen more: one seed
# fits `make test`'s budget, the three run with `make reliability`.
@pytest.mark.long_running(400)
@pytest.mark.parametrize("seed", SEEDS)
def test_crash_matrix(seed, tmp_path, spark, crash_driver, pg_server_dsn, metadata_template, capsys, monkeypatch,
                      record_property):
    from trailbound.sources.simulator import simulate

    source = tmp_path / "source"
    simulate(source / "archive", source / "truth.json", seed=seed, records=3000, hours=HOURS, segment_minutes=30,
             start=START, schema_changes=SCHEMA_CHANGES)
    truth = json.loads((source / "truth.json").read_text())
    made = []
    homes = {}
    try:
        for kind in ("baseline", "crashed"):
            directory = tmp_path / kind
            shutil.copytree(source / "archive", directory / "archive")
            suffix = f"{os.getpid()}_{os.urandom(4).hex()}"
            meta, target = f"tb_matrix_meta_{suffix}", f"tb_matrix_target_{suffix}"
            admin = psycopg2.connect(pg_server_dsn)
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(meta),
                                                                            sql.Identifier(metadata_template)))
            admin.close()
            made.append(meta)
            target_dsn = _create_database(pg_server_dsn, target)
            made.append(target)
            home = homes[kind] = Home(directory, psycopg2.extensions.make_dsn(pg_server_dsn, dbname=meta), target_dsn)
            connection = psycopg2.connect(target_dsn)
            with connection, connection.cursor() as cur:  # as before the changes: replicat follows them
                tgt.create_tables(cur, _first_versions(load_defs(home.config.archive_dir("SRC"))),
                                  home.config.replicat("REP1").map)
            connection.close()
            with home.store() as store:
                retention.register(store, home.config, "EXT1")
        _run_matrix(seed, homes, truth, spark, capsys, monkeypatch, record_property, crash_driver)
    finally:
        for name in made:
            _drop_database(pg_server_dsn, name)


def _first_versions(defs: dict) -> dict:
    """The source's tables as they were when the archive began (none that came later)."""
    return {name: TableDef(name, table.versions[0].columns, table.versions[0].key)
            for name, table in defs.items() if table.versions[0].scn == 0}


def _run_matrix(seed, homes, truth, spark, capsys, monkeypatch, record_property, driver: ConnectCrashDriver):
    baseline, crashed = homes["baseline"], homes["crashed"]
    cells: dict[str, list[str]] = {}   # "stage point" -> what went wrong
    only = set(filter(None, os.environ.get(ONLY_ENV, "").split(",")))
    for number, until_hours in enumerate(UNTIL):
        until = START + timedelta(hours=until_hours) if until_hours is not None else None
        round_cells = []
        for stage in STAGES:
            baseline.run(spark, stage, until)
            for kind, point in ((s, p) for s, p in PLAN[number] if s == stage and (not only or p in only)):
                cell = f"{stage} {point}"
                if cell in cells:  # a point killed in both rounds (mid_purge) is two cells
                    cell += f" (round {number})"
                round_cells.append(cell)
                began = time.perf_counter()
                if point.startswith("drop:"):
                    cells[cell] = _drop_connection(crashed, stage, point, until, capsys, monkeypatch)
                else:
                    cells[cell] = _crash(crashed, stage, point, until, driver)
                print(f"seed {seed} round {number} {cell}: {time.perf_counter() - began:.1f} s {cells[cell]}",
                      file=sys.__stderr__)
            crashed.run(spark, stage, until)
            if stage == "replicat":
                # Before the purge: the trails' records are read as they commit.
                baseline.read_new_trail_records()
                crashed.read_new_trail_records()
        found = _divergences(crashed.snapshot(truth), baseline.snapshot(truth))
        for cell in round_cells:
            cells[cell] = cells[cell] + found

    final = crashed.snapshot(truth)
    reference = baseline.snapshot(truth)
    totals = {}
    for which in ("local", "remote"):
        mine, theirs = _transactions(final[which]), _transactions(reference[which])
        totals[f"{which} duplicates"] = len(mine) - len(set(mine))
        totals[f"{which} losses"] = len(set(theirs) - set(mine))
    assert len(reference["remote"]) > 1000 and reference["purged_files"] and reference["purged_segments"], \
        "the scenario moves real data and purges for real"
    target_vs_truth = differences(crashed.target_dsn, truth)
    baseline_vs_truth = differences(baseline.target_dsn, truth)
    totals["target vs truth (extra + missing rows)"] = sum(e + m for e, m, _ in target_vs_truth.values())
    totals["baseline vs truth"] = sum(e + m for e, m, _ in baseline_vs_truth.values())
    lanes = {kind: _lane_groups(home) for kind, home in homes.items()}
    record_property("crash_matrix", json.dumps({"seed": seed, "cells": {c: len(p) for c, p in cells.items()},
                                                "totals": totals, "elsewhere": ELSEWHERE, "lane_groups": lanes}))
    record_property("lane_groups", json.dumps(lanes))
    problems = {c: p for c, p in cells.items() if p}
    assert not problems, json.dumps(problems, indent=1, default=str)[:6000]
    assert all(v == 0 for v in totals.values()), totals
    # The lane: cells fail if no group reaches a lane; this holds the runs that finish
    # each round (whose rows are compared) to lanes too.
    assert lanes["crashed"] >= MIN_LANE_GROUPS, \
        f"the crashed home's replicat runs applied {lanes['crashed']} group(s) on parallel lanes, " \
        f"fewer than {MIN_LANE_GROUPS}"


def _lane_groups(home: Home) -> int:
    """Groups REP1's completed runs applied on parallel lanes (replicat_run.parallel_groups)."""
    with home.store() as store, store.transaction() as cur:
        cur.execute("SELECT coalesce(sum(parallel_groups), 0) AS n FROM trailbound.replicat_run"
                    " WHERE group_name = 'REP1'")
        return int(cur.fetchone()["n"])
