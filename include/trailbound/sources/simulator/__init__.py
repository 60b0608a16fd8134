"""The simulated source: a busy OLTP database that writes a redo archive (the embedded default).

`simulate()` plays a shop (schema `shop`) and its HR department (schema `hr`) on a
database with several redo threads, and writes what their redo log would hold, exactly
in the archive format of trailbound.archive.contract, plus `defs.json` and a truth file:
the final state of every table after the committed work, which a replica must reach.

How it works, in one paragraph: a single loop emits one log record per step. Each open
transaction is a Python generator that performs one change per step (so transactions
interleave freely) against a small model of the database: committed rows, per-transaction
private changes with an undo log for savepoints, and row/table locks so that, as in a real
database, no two open transactions touch the same row and a TRUNCATE waits for every other
user of its table. Every record gets the next SCN of one global clock and a log time that
advances evenly from `start` to `start + hours`; each thread switches to a new segment every
`segment_minutes` of log time. A few long stories (transactions open for hours, a truncate
every few hours, the last thread going quiet and then stopping for good) are scheduled at
fixed fractions of the duration, so every archive size holds all of them.

Everything is drawn from one seeded random generator and nothing depends on set or hash
order, so the same arguments produce byte-identical files.

    __init__.py  simulate(): the entry point, and its summary
    engine.py    Simulator: the SCN clock, threads and segments, the database model, the truth
    workload.py  Workload: the transaction stories, the long stories' schedule
    changes.py   SchemaChange: opt-in ALTER / CREATE TABLE, recorded as table versions
    tables.py    SimTable and the source tables (shop, hr)
    pools.py     the data pools: awkward values, large values, hostile xids
"""

from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from trailbound.archive.contract import DEFS_FILE, FORMATS, SEGMENT_RE
from trailbound.archive.writer import from_micros, write_defs
from trailbound.durable import atomic_write
from trailbound.sources.simulator.changes import PRESETS as SCHEMA_CHANGES
from trailbound.sources.simulator.changes import SchemaChange
from trailbound.sources.simulator.engine import TRUTH_FORMAT, Simulator
from trailbound.sources.simulator.tables import SimTable, heartbeat_table, source_tables
from trailbound.sources.simulator.workload import Workload

__all__ = ["DEFAULT_CLOSE_AT", "DEFAULT_QUIET_STRETCHES", "SCHEMA_CHANGES", "SIMULATOR_FORMATS", "TRUTH_FORMAT",
           "SchemaChange", "SimTable", "SimulationSummary", "Simulator", "Workload", "simulate", "source_tables"]

SIMULATOR_FORMATS = FORMATS + ("mixed",)

# Last thread: quiet stretches (it writes empty segments) and the moment it stops for
# good, as fractions of the duration.
DEFAULT_QUIET_STRETCHES = ((0.20, 0.28), (0.45, 0.52))
DEFAULT_CLOSE_AT = 0.75


@dataclass
class SimulationSummary:
    archive_dir: Path
    truth_path: Path
    records: int
    committed: int
    rolled_back: int
    open_at_end: int
    segments: dict[int, int]
    bytes: int
    first_time: datetime
    last_time: datetime
    last_scn: int
    elapsed_seconds: float
    features: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        rate = self.records / self.elapsed_seconds if self.elapsed_seconds else 0.0
        segments = ", ".join(f"thread {t}: {n}" for t, n in sorted(self.segments.items()))
        features = ", ".join(f"{name} {count}" for name, count in self.features.items())
        return "\n".join([
            f"{self.records:,} records in {self.elapsed_seconds:.1f} s ({rate:,.0f} records/s), "
            f"{self.bytes / 1e6:,.1f} MB in {self.archive_dir}",
            f"log time {self.first_time.isoformat()} .. {self.last_time.isoformat()}, last SCN {self.last_scn}",
            f"transactions: {self.committed:,} committed, {self.rolled_back:,} rolled back, "
            f"{self.open_at_end:,} open at the end",
            f"segments: {segments}",
            f"features: {features}",
        ])


def simulate(
    archive_dir: str | os.PathLike,
    truth_path: str | os.PathLike,
    *,
    seed: int = 7,
    records: int = 200_000,
    hours: float = 48.0,
    threads: int = 3,
    fmt: str = "mixed",
    start: datetime = datetime(2026, 11, 1, tzinfo=UTC),
    segment_minutes: float = 15,
    segment_records: int | None = None,
    concurrency: int = 6,
    quiet_stretches: tuple[tuple[float, float], ...] = DEFAULT_QUIET_STRETCHES,
    close_last_thread_at: float | None = DEFAULT_CLOSE_AT,
    hostile_xid_rate: float = 0.01,
    rollback_rate: float = 0.04,
    schema_changes: tuple[SchemaChange, ...] | str = (),
    heartbeat_seconds: float | None = None,
    heartbeat_source: str = "SIM",
) -> SimulationSummary:
    """Write a simulated redo archive (segments and defs.json) into `archive_dir` and the
    state a replica must reach into `truth_path`.

    records, hours: how many records and how much log time. threads: redo threads; the last
    one goes quiet during `quiet_stretches` (fractions of the duration; it writes empty
    segments) and stops for good at `close_last_thread_at` (None: never). fmt: "parquet",
    "jsonl" or "mixed" (alternating per segment). Segments switch every `segment_minutes`
    of log time, and also after `segment_records` records if given. concurrency: open
    short transactions per thread. schema_changes: ALTER TABLE / CREATE TABLE statements
    (changes.py), or the name of a set of them ("none", "demo", "all"), each recorded as a
    table version in defs.json. heartbeat_seconds: a heartbeat row of source
    `heartbeat_source` every that many seconds of log time (trailbound/heartbeat.py), in
    `trailbound.trailbound_heartbeat` (None: none). Deterministic: the same arguments
    write the same bytes.
    """
    if isinstance(schema_changes, str):
        if schema_changes not in SCHEMA_CHANGES:
            raise ValueError(f"schema_changes must be one of {tuple(SCHEMA_CHANGES)}, not {schema_changes!r}")
        schema_changes = SCHEMA_CHANGES[schema_changes]
    if fmt not in SIMULATOR_FORMATS:
        raise ValueError(f"fmt must be one of {SIMULATOR_FORMATS}, not {fmt!r}")
    if records < 1 or hours <= 0 or threads < 1 or segment_minutes <= 0:
        raise ValueError("records, hours, threads and segment_minutes must be positive")
    if start.tzinfo is None:
        raise ValueError("start must be an aware datetime")
    archive = Path(archive_dir)
    archive.mkdir(parents=True, exist_ok=True)
    leftovers = [p.name for p in archive.iterdir() if SEGMENT_RE.match(p.name) or p.name == DEFS_FILE]
    if leftovers:
        # Old segments would mix with the new ones into an archive that is neither.
        raise FileExistsError(f"{archive} already holds an archive ({sorted(leftovers)[0]} ...)")

    began = time.perf_counter()
    # Millions of small dicts and tuples and no reference cycles (finished transactions
    # break theirs): the cyclic garbage collector would only rescan them over and over.
    collecting = gc.isenabled()
    gc.disable()
    try:
        sim = Simulator(
            archive, seed=seed, records=records, hours=hours, threads=threads, fmt=fmt,
            start=start, segment_minutes=segment_minutes, segment_records=segment_records,
            concurrency=concurrency, quiet_stretches=quiet_stretches,
            close_at=close_last_thread_at, hostile_xid_rate=hostile_xid_rate,
            rollback_rate=rollback_rate, schema_changes=schema_changes,
            heartbeat_seconds=heartbeat_seconds, heartbeat_source=heartbeat_source,
        )
        tables = sim.tables + ([heartbeat_table()] if heartbeat_seconds else [])
        write_defs(archive, [table.definition() for table in tables])
        sim.run()
        truth = sim.truth()
    finally:
        if collecting:
            gc.enable()
    truth_file = Path(truth_path)
    truth_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(truth_file, (json.dumps(truth, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))

    return SimulationSummary(
        archive_dir=archive,
        truth_path=truth_file,
        records=sim.count,
        committed=sim.committed,
        rolled_back=sim.rolled_back,
        open_at_end=truth["transactions"]["open_at_end"],
        segments={t.number: t.segments for t in sim.threads},
        bytes=sim.bytes,
        first_time=from_micros(sim.start_us),
        last_time=from_micros(sim.end_us),
        last_scn=sim.scn,
        elapsed_seconds=time.perf_counter() - began,
        features=dict(sim.features),
    )
