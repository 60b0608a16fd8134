"""`trailbound load SRC REP1 [--table PATTERN] [--chunk-rows N] [--mode snapshot|watermark]`.

Copies the current rows of the source tables a replicat maps into its target, in
key-range chunks on Spark (copy.py), without locking the source, and hands over to the
replicat with nothing lost and nothing applied twice (docs/initial-load.md):

- snapshot (GoldenGate's initial load, then START REPLICAT ATCSN): before the first
  pull, the slot is created again with an exported snapshot; every chunk reads that
  snapshot; the replicat is then positioned at the slot's consistent point, so it
  applies exactly the transactions the snapshot does not hold. The replicat's group is
  held for the whole load: no run can apply the log onto half-loaded tables.
- watermark (Netflix's DBLog): at any time, on tables already replicated; each chunk is
  read between a low and a high watermark written to the source, and replicat applies
  it at the high watermark (replicat/windows.py). Progress is kept per chunk: a load
  killed anywhere resumes from its first chunk not done.

Talks to the source as `sources/postgres/` does (only cli/load.py imports this module).
"""

from __future__ import annotations


import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import psycopg2
from psycopg2 import sql

from trailbound.archive import segments as archive_segments
from trailbound.archive.segments import load_defs
from trailbound.config import Config
from trailbound.crash import crashpoint
from trailbound.errors import TrailboundError
from trailbound.grouplock import AdvisoryLock, GroupLock
from trailbound.load import progress
from trailbound.load.copy import SESSION, ChunkTask, copy_chunk
from trailbound.metadata import MetadataStore, connection_error, dsn_from_env
from trailbound.replicat import loadinfo
from trailbound.replicat import target as tgt
from trailbound import keyranges
from trailbound.replicat.windows import WATERMARK, WATERMARK_DDL, create_state
from trailbound.sources.postgres import state as miner_state
from trailbound.tables import python_regex

MODES = ("snapshot", "watermark")
CRASH_POINTS = ("load_between_chunks",)


@dataclass
class LoadResult:
    load_id: int
    mode: str
    replicat: str
    tables: list[loadinfo.TableProgress] = field(default_factory=list)
    seconds: float = 0.0
    resumed: bool = False
    note: str = ""

    def describe(self) -> str:
        rows = sum(t.rows_done for t in self.tables)
        rate = f", {rows / self.seconds:.0f} rows/s" if self.seconds else ""
        lines = [f"LOAD {self.load_id} ({self.mode}{', resumed' if self.resumed else ''}) for replicat "
                 f"{self.replicat}: {len(self.tables)} table(s), {rows} rows in {self.seconds:.1f} s{rate}"]
        lines += [f"  {t.line()}" for t in self.tables]
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


@dataclass(frozen=True)
class _Table:
    source: str                # schema.name at the source
    plan: tgt.TablePlan


def run_load(spark, store: MetadataStore, config: Config, source: str, replicat: str, *, mode: str = "snapshot",
             pattern: str = "*.*", chunk_rows: int = 50_000, say: Callable[[str], None] = print,
             source_dsn: str | None = None, target_dsn: str | None = None) -> LoadResult:
    if mode not in MODES:
        raise TrailboundError(f"load mode {mode!r}: choose snapshot or watermark")
    if chunk_rows < 1:
        raise TrailboundError(f"--chunk-rows {chunk_rows}: a chunk holds at least one row")
    source = config.source_name(source)
    pg = config.postgres(source)
    name = config.replicat_name(replicat)
    if config.replicat(name).source.upper() != source.upper():
        raise TrailboundError(f"replicat {name} applies source {config.replicat(name).source}, not {source}")
    source_dsn = source_dsn or dsn_from_env(pg.dsn_env)
    target_dsn = target_dsn or dsn_from_env(config.target.dsn_env)
    load = _Load(spark, store, config, source, name, pattern, chunk_rows, say, source_dsn, target_dsn)
    busy = f"a load for replicat {name} is running; try again when it ends"
    with AdvisoryLock(store, loadinfo.load_lock_key(name), busy):
        return load.at_snapshot() if mode == "snapshot" else load.between_watermarks()


class _Load:
    def __init__(self, spark, store, config, source, replicat, pattern, chunk_rows, say, source_dsn, target_dsn):
        self.spark, self.store, self.config = spark, store, config
        self.source, self.replicat, self.pattern, self.chunk_rows, self.say = (source, replicat, pattern, chunk_rows,
                                                                               say)
        self.source_dsn, self.target_dsn = source_dsn, target_dsn
        self.archive = config.archive_dir(source)

    # ---------------------------------------------------------------- the two modes

    def at_snapshot(self) -> LoadResult:
        from trailbound.replicat.alter import reposition
        from trailbound.sources.postgres.snapshot import ExportedSnapshot

        state = miner_state.load(self.archive)
        pulled = [s for s in archive_segments.discover(self.archive) if s.thread == miner_state.THREAD]
        if state.sequence or pulled:
            raise TrailboundError(
                f"source {self.source}: {len(pulled) or state.sequence} segment(s) already pulled from slot "
                f"{state.slot}: a snapshot load only comes before the first pull (the slot is created again at the "
                f"snapshot). Load into a replica that is already running with `trailbound load {self.source} "
                f"{self.replicat} --mode watermark`")
        began = time.perf_counter()
        with GroupLock(self.store, "replicat", self.replicat):
            tables = self._tables()
            with self.store.transaction() as cur:
                cur.execute("UPDATE trailbound.load_run SET state = 'abandoned', ended_at = now()"
                            " WHERE upper(replicat) = upper(%s) AND mode = 'snapshot' AND state = 'running'",
                            (self.replicat,))
            with ExportedSnapshot(self.source_dsn, self.config.postgres(self.source).slot) as snapshot:
                miner_state.save(self.archive, miner_state.MinerState(0, snapshot.consistent,
                                                                      snapshot.created_at, snapshot.slot))
                load_id = progress.start(self.store, source=self.source, replicat=self.replicat, mode="snapshot",
                                         pattern=self.pattern, chunk_rows=self.chunk_rows,
                                         snapshot_lsn=str(snapshot.consistent))
                self.say(f"LOAD {load_id}: slot {snapshot.slot} created again at {snapshot.consistent}, exported "
                         f"snapshot {snapshot.name}; every chunk reads it")
                self._plan(load_id, tables)
                self._copy(load_id, lambda chunk: {"snapshot": snapshot.name})
                # Every commit at or after the consistent point is in the slot and not in the
                # snapshot; every one before it is in the snapshot: atcsn <consistent point>.
                said = reposition(self.store, self.config, self.replicat, ["atcsn", str(snapshot.consistent.scn)],
                                  target_dsn=self.target_dsn)
            progress.finish(self.store, load_id)
        return LoadResult(load_id, "snapshot", self.replicat, loadinfo.tables(self.store, load_id),
                          time.perf_counter() - began, note=said)

    def between_watermarks(self) -> LoadResult:
        began = time.perf_counter()
        self._prepare_watermarks()
        tables = self._tables()
        running = loadinfo.running(self.store, self.replicat, "watermark")
        if running and running["table_pattern"] != self.pattern:
            raise TrailboundError(f"load {running['load_id']} for replicat {self.replicat} (tables "
                                  f"{running['table_pattern']}) is not finished: run it again with --table "
                                  f"{running['table_pattern']!r} --mode watermark to resume it first")
        if running:
            load_id = running["load_id"]
            self.say(f"LOAD {load_id}: resuming, {len(progress.pending(self.store, load_id))} chunk(s) to go")
        else:
            load_id = progress.start(self.store, source=self.source, replicat=self.replicat, mode="watermark",
                                     pattern=self.pattern, chunk_rows=self.chunk_rows)
            self.say(f"LOAD {load_id}: between watermarks in {WATERMARK.name}")
            self._plan(load_id, tables)
        self._copy(load_id, lambda chunk: {"window_id": uuid.uuid4().hex})
        # Windows that never got their high watermark (a killed load's) are closed by
        # replicat when it sees their rows deleted; finished ones were applied before.
        loaded = sorted(t.source_table for t in loadinfo.tables(self.store, load_id))
        self._source(lambda cur: cur.execute(sql.SQL("DELETE FROM {} WHERE source_table = ANY(%s)").format(
            WATERMARK.ident), (loaded,)))
        progress.finish(self.store, load_id)
        return LoadResult(load_id, "watermark", self.replicat, loadinfo.tables(self.store, load_id),
                          time.perf_counter() - began, resumed=bool(running),
                          note=f"Replicat {self.replicat} applies each chunk when it reaches the chunk's high "
                               "watermark: run the pipeline (archive pull, extract, pump, replicat) as usual")

    # ---------------------------------------------------------------- steps

    def _source(self, work):
        try:
            connection = psycopg2.connect(self.source_dsn, options=SESSION)
        except psycopg2.Error as exc:
            raise connection_error(f"source {self.source}", self.source_dsn, exc) from None
        connection.autocommit = True
        try:
            with connection.cursor() as cur:
                return work(cur)
        finally:
            connection.close()

    def _target(self, work):
        connection = tgt.connect(self.config, self.target_dsn)
        try:
            with connection.cursor() as cur:
                result = work(cur)
            connection.commit()
            return result
        finally:
            connection.close()

    def _tables(self) -> list[_Table]:
        """The source tables matching --table that the replicat maps, with their target plans."""
        defs = load_defs(self.archive)
        chosen = {n: d for n, d in defs.items() if python_regex([self.pattern]).fullmatch(n) and n != WATERMARK.name}
        if not chosen:
            raise TrailboundError(f"no table of source {self.source} (defs.json) matches --table {self.pattern}")
        plans = self._target(lambda cur: tgt.plan_tables(cur, chosen, self.config.replicat(self.replicat).map))
        tables = []
        for name, plan in sorted(plans.items()):
            if plan is None:
                raise TrailboundError(f"source table {name} is not mapped by replicat {self.replicat}'s MAP: nothing "
                                      "to load it into")
            if plan.keyless:
                raise TrailboundError(f"source table {name} has no primary key: a load cuts tables into key ranges "
                                      "(leave it out with --table, or copy it yourself)")
            tables.append(_Table(name, plan))
        return tables

    def _plan(self, load_id: int, tables: list[_Table]) -> None:
        for table in tables:
            schema, name = table.plan.source.split(".", 1)

            def planned(cur, schema=schema, name=name):
                key = keyranges.primary_key(cur, schema, name)
                if tuple(key) != table.plan.key:
                    raise TrailboundError(f"source table {table.source}: its primary key is ({', '.join(key)}), "
                                          f"defs.json says ({', '.join(table.plan.key)}); refresh defs.json first")
                return (keyranges.estimate_rows(cur, schema, name),
                        keyranges.plan(cur, schema, name, key, self.chunk_rows))

            estimate, ranges = self._source(planned)
            progress.add_table(self.store, load_id, table.source, table.plan.target, list(table.plan.key), estimate,
                               ranges)
            self.say(f"LOAD {load_id}: {table.source} -> {table.plan.target}: {len(ranges)} chunk(s) of about "
                     f"{self.chunk_rows} rows, about {estimate} rows")

    def _copy(self, load_id: int, extra: Callable[[progress.ChunkRow], dict]) -> None:
        """Every pending chunk on Spark, a wave of tasks at a time; after each wave the
        chunks done are recorded and the progress printed."""
        plans = {t.source: t.plan for t in self._tables()}
        chunks = progress.pending(self.store, load_id)
        tasks = []
        for chunk in chunks:
            plan = plans[chunk.source_table]
            tasks.append(ChunkTask(chunk.source_table, chunk.chunk_no, tuple(chunk.source_table.split(".", 1)),
                                   (plan.schema, plan.name), plan.columns, plan.key, chunk.lo, chunk.hi,
                                   **extra(chunk)))
        if not tasks:
            return
        from trailbound.spark import parallelism, run_tasks

        wave = parallelism(self.spark)
        source_dsn, target_dsn = self.source_dsn, self.target_dsn
        began, copied = time.perf_counter(), 0
        for start in range(0, len(tasks), wave):
            batch = tasks[start:start + wave]
            try:
                done = run_tasks(self.spark, lambda task: copy_chunk(task, source_dsn, target_dsn), batch)
            except Exception as exc:  # a task's error comes wrapped in the JVM's
                raise TrailboundError(f"load {load_id}: a chunk failed: {_task_error(exc)}; the chunks done are "
                                      "recorded, run the load again") from None
            progress.mark_done(self.store, load_id, [(d.source_table, d.chunk_no, d.rows, d.window_id) for d in done])
            copied += sum(d.rows for d in done)
            crashpoint("load_between_chunks")
            rate = copied / max(time.perf_counter() - began, 1e-6)
            for table in loadinfo.tables(self.store, load_id):
                if table.source_table in {d.source_table for d in done}:
                    self.say(f"LOAD {load_id}: {table.line(rate)}")

    def _prepare_watermarks(self) -> None:
        """The watermark table: in the source, in defs.json and the publication, captured by
        every extract of the source, and in the target with the window tables."""
        from trailbound.sources.postgres.admin import _matches, add_source

        self._source(lambda cur: cur.execute(WATERMARK_DDL))
        pg = self.config.postgres(self.source)
        if WATERMARK.name not in load_defs(self.archive):
            if not any(_matches(p, WATERMARK.name) for p in pg.table):
                raise TrailboundError(_watermark_hint(self.source, "sources", "postgres.table"))
            self.say(add_source(self.config, self.source, refresh_defs=True))
        for extract, settings in self.config.extracts.items():
            if settings.source.upper() == self.source.upper() and settings.table is not None \
                    and not python_regex(settings.table).fullmatch(WATERMARK.name):
                raise TrailboundError(_watermark_hint(self.source, f"extracts.{extract}", "table"))
        defs = {WATERMARK.name: load_defs(self.archive)[WATERMARK.name]}
        rules = self.config.replicat(self.replicat).map

        def target(cur):
            tgt.create_tables(cur, defs, rules)
            create_state(cur)
        self._target(target)


def _watermark_hint(source: str, section: str, key: str) -> str:
    return (f"a watermark load writes its watermarks to {WATERMARK.name} in the source, which must be published "
            f"and captured like a table: add \"{WATERMARK.name}\" to {section}.{key} in the configuration "
            f"(docs/initial-load.md); the load then adds it to source {source}'s publication and defs.json")


def _task_error(exc: Exception) -> str:
    """The Python error a Spark task raised: its last line (the JVM's wrapper says the rest)."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith(("psycopg2.", "RuntimeError", "trailbound.", "TrailboundError")) or "Error:" in line:
            return line
    return lines[-1] if lines else type(exc).__name__
