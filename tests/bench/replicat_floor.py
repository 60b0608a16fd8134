"""The floor under replicat's insert-heavy apply on one connection: the target's
statements alone, every payload prepared beforehand, no trail, no Python work between
them. Beside a plain COPY of the same rows (3 statements), it shows how much of a COPY
one target transaction per GROUPTRANSOPS can reach at best (docs/benchmarks/replicat.md).

    .venv/bin/python tests/bench/replicat_floor.py [--rows N] [--groups G] [--rounds R]

Needs TRAILBOUND_TARGET_DSN (make bench's throwaway server). Each measurement gets a fresh
database `trailbound_bench_replicat_floor` with the benchmark's three tables:
- plain: one COPY per table of all its rows, a commit after each (bench_replicat's plain COPY);
- grouped: G target transactions, each a COPY per table of its share of the rows, the
  checkpoint row UPDATE, COMMIT (what replicat sends for insert-only groups); for these
  two, also the CPU their server process used (read from /proc: make bench's server runs
  on this machine; "-" otherwise);
- grouped, no checkpoint row: the same without the UPDATE;
- two connections: the grouped statements (no checkpoint row) split between two
  sessions, alternate groups, run at once (what parallel apply could reach);
- beside the trail's reading: the two connections again, with the checkpoint row, while a
  third thread does the one piece of client work no replicat can skip: reading a trail
  file of the same rows (Parquet, written by trail.TrailWriter) and parsing its JSON
  images with the engine's parser (Arrow's JSON reader). No net change, no COPY text, no
  planning: the floor for any client on this machine.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg2
import pyarrow.compute as pc
import pyarrow.parquet as pq
from psycopg2 import sql

import bench_replicat as bench
from benchdb import backend_cpu, fresh_database


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from trailbound.archive.segments import load_defs
    from trailbound.archive.writer import write_defs
    from trailbound.metadata import dsn_from_env
    from trailbound.replicat import target as tgt
    from trailbound.copytext import parse_images
    from trailbound.sources.simulator import source_tables
    from trailbound.trail import format as trail

    work = tempfile.TemporaryDirectory()
    write_defs(Path(work.name), [t.definition() for t in source_tables()])
    defs = load_defs(Path(work.name))
    rows = bench.Rows(99)
    per_table = args.rows // len(bench.TABLES)
    made = {t: [rows.new(t) for _ in range(per_table)] for t in bench.TABLES}
    columns = {t: [c.name for c in defs[t].columns] for t in bench.TABLES}
    whole = {t: bench.copy_text(made[t], columns[t]) for t in bench.TABLES}
    share = per_table // args.groups
    parts = {t: [bench.copy_text(made[t][g * share:(g + 1) * share], columns[t]) for g in range(args.groups)]
             for t in bench.TABLES}
    server = dsn_from_env("TRAILBOUND_TARGET_DSN")
    # The same rows as a trail: one single-record transaction each, the tables interleaved.
    inserts = [[("INSERT", t, None, made[t][i])] for i in range(per_table) for t in bench.TABLES]
    trail_files = bench.write_trail(inserts, Path(work.name) / "lt", trail)

    def read_and_parse() -> None:
        for written in trail_files:
            records = pq.ParquetFile(written.path).read()
            for table in bench.TABLES:
                images = records.filter(pc.equal(records.column("table"), table)).column("after")
                if parse_images(images, tuple(columns[table]), tuple(c.type for c in defs[table].columns)) is None:
                    raise AssertionError(f"{table}: images do not parse")

    def fresh():
        dsn = fresh_database(server, "trailbound_bench_replicat_floor")
        connection = psycopg2.connect(dsn)
        with connection.cursor() as cur:
            tgt.create_tables(cur, {t: defs[t] for t in bench.TABLES}, [bench.configuration_rule("shop")])
            cur.execute("CREATE TABLE checkpoint_row (group_name text PRIMARY KEY, position bigint)")
            cur.execute("INSERT INTO checkpoint_row VALUES ('REP1', 0)")
        connection.commit()
        return connection, dsn

    def copy_statement(cur, table: str) -> str:
        return sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(*table.split(".", 1))).as_string(cur)

    def plain() -> tuple[float, float | None]:
        connection, _ = fresh()
        server = backend_cpu(connection)
        started = time.perf_counter()
        with connection.cursor() as cur:
            for table in bench.TABLES:
                cur.copy_expert(copy_statement(cur, table), io.BytesIO(whole[table]), size=1 << 20)
                connection.commit()
        seconds = time.perf_counter() - started
        used = server() if server else None
        connection.close()
        return seconds, used

    def grouped(connection, groups, checkpoint: bool) -> None:
        with connection.cursor() as cur:
            statements = {t: copy_statement(cur, t) for t in bench.TABLES}
            for group in groups:
                for table in bench.TABLES:
                    cur.copy_expert(statements[table], io.BytesIO(parts[table][group]), size=1 << 20)
                if checkpoint:
                    cur.execute("UPDATE checkpoint_row SET position = %s WHERE group_name = 'REP1'", (group,))
                connection.commit()

    def one_connection(checkpoint: bool) -> tuple[float, float | None]:
        connection, _ = fresh()
        server = backend_cpu(connection)
        started = time.perf_counter()
        grouped(connection, range(args.groups), checkpoint)
        seconds = time.perf_counter() - started
        used = server() if server else None
        connection.close()
        return seconds, used

    def two_connections(checkpoint: bool = False, beside=None) -> float:
        first, dsn = fresh()
        second = psycopg2.connect(dsn)
        started = time.perf_counter()
        threads = [threading.Thread(target=grouped, args=(second, range(1, args.groups, 2), checkpoint))]
        threads += [threading.Thread(target=beside)] if beside else []
        for thread in threads:
            thread.start()
        grouped(first, range(0, args.groups, 2), checkpoint)
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        first.close()
        second.close()
        return seconds

    print(f"{per_table * len(bench.TABLES):,} rows, {args.groups} groups")
    print("| round | plain COPY | its server CPU | grouped | its server CPU | share of COPY | grouped, no checkpoint "
          "row | two connections | reading and parsing the trail alone | two connections beside it | share of COPY |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    shown = lambda cpu: "-" if cpu is None else f"{cpu:.2f} s"  # noqa: E731
    for number in range(1, args.rounds + 1):
        copy_seconds, copy_cpu = plain()
        with_checkpoint, grouped_cpu = one_connection(True)
        without, _ = one_connection(False)
        parallel = two_connections()
        began = time.perf_counter()
        read_and_parse()
        reading = time.perf_counter() - began
        beside = two_connections(checkpoint=True, beside=read_and_parse)
        print(f"| {number} | {copy_seconds:.3f} s | {shown(copy_cpu)} | {with_checkpoint:.3f} s | {shown(grouped_cpu)} | "
              f"{copy_seconds / with_checkpoint:.0%} | "
              f"{without:.3f} s | {parallel:.3f} s | {reading:.3f} s | {beside:.3f} s | {copy_seconds / beside:.0%} |",
              flush=True)
    work.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
