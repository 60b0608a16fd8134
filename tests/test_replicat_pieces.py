"""A source transaction longer than replicat's chunk_records is applied in pieces (chunks
of chunk_records records each) inside its one target transaction: the target never holds
part of it, a crash between pieces or a row the target refuses leaves the checkpoint row
where it was, and the rerun converges. On capture's side, such a transaction is written
into its trail file a row group at a time, with a running digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg2
import pyarrow.parquet as pq
import pytest

from capture_kit import ins, rec
from replicat_kit import captured as _captured, checkpoint_row, orders
from trailbound import cli
from trailbound.crash import CRASH_ENV
from trailbound.durable import file_sha256
from trailbound.positions import Scn
from trailbound.trail import format as trail

pytestmark = [pytest.mark.spark, pytest.mark.pg]

# T1 (3 inserts), T2 (20 inserts, then an update and a delete of rows it inserted: 22
# records, six pieces of 4 records, the update and delete in the last two, rows its first
# piece inserted), T3 (1 insert).
T2_KEYS = range(10, 30)
RECORDS = ([ins(10 + k, "T1", k) for k in (1, 2, 3)] + [rec(14, "T1", "COMMIT")]
           + [ins(20 + i, "T2", key) for i, key in enumerate(T2_KEYS)]
           + [rec(40, "T2", "UPDATE", "shop.orders", key=10, note="changed"), rec(41, "T2", "DELETE", "shop.orders",
                                                                                key=11),
              rec(42, "T2", "COMMIT"), ins(50, "T3", 40), rec(51, "T3", "COMMIT")])
AFTER_T1 = {1: "n1", 2: "n2", 3: "n3"}
APPLIED = {**AFTER_T1, **{key: f"n{key}" for key in T2_KEYS if key != 11}, 10: "changed", 40: "n40"}


def test_a_transaction_longer_than_chunk_records_is_applied_in_pieces_inside_one_target_transaction(
        tmp_path, spark, store, target_dsn, monkeypatch, capsys):
    config_path, _ = _captured(tmp_path, spark, store, target_dsn, RECORDS, grouptransops=1, chunk_records=4)
    env = {**os.environ, "TRAILBOUND_METADATA_DSN": store.connection.dsn, "TRAILBOUND_TARGET_DSN": target_dsn}
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    command = [sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "replicat", "run", "REP1"]

    # Killed after T2's first piece: T1 is committed with its checkpoint row, nothing of T2 is.
    crashed = subprocess.run(command, env={**env, CRASH_ENV: "between_pieces"}, capture_output=True, text=True,
                             timeout=300)
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    after_t1 = checkpoint_row(target_dsn)
    assert (after_t1["seqno"], after_t1["rba"]) == (1, 3) and orders(target_dsn) == AFTER_T1

    # A row the target refuses in T2's fourth piece (key 25, there already): the piece is
    # replayed record by record, the record is named, and the whole of T2 rolls back.
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("INSERT INTO shop.orders (id, note) VALUES (25, 'in the way')")
    connection.close()
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), "replicat", "run", "REP1"]) == 1
    # One ERROR line (a warning that the piece is replayed may come before it, depending on
    # the logging handlers of the process: Airflow's, imported by another test, write too).
    said = capsys.readouterr().err
    errors = [line for line in said.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1, said
    error = errors[0]
    assert "rba 18" in error and '"id": 25' in error and "INSERT" in error, error
    assert checkpoint_row(target_dsn) == after_t1 and orders(target_dsn) == {**AFTER_T1, 25: "in the way"}

    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("DELETE FROM shop.orders WHERE id = 25")
    connection.close()
    assert cli.main(["--config", str(config_path), "replicat", "run", "REP1"]) == 0
    out = capsys.readouterr().out
    assert "1 transaction(s) longer than chunk_records applied in 6 pieces" in out, out
    assert orders(target_dsn) == APPLIED
    row = checkpoint_row(target_dsn)
    assert (row["seqno"], row["rba"]) == (1, 26)


def test_capture_writes_a_long_transaction_a_row_group_at_a_time_and_it_reads_back_whole(
        tmp_path, spark, store, target_dsn):
    """Capture's trail write streams: Spark hands the task 1,000-record batches, the
    writer cuts them into the file's row groups (4,096 records, then the rest) and hashes
    each as it goes, holding never the whole transaction. The file must read back as one
    writer of the whole would have written it: the records in log order, the 5,000-record
    transaction's indicators BEGIN ... END across the cuts (a one-record transaction on
    each side), the footer's digest the one a reader computes over the whole file, the
    same bytes as a file written from the whole table at once (which replicat applies in
    pieces: the test above)."""
    keys = range(1, 5001)
    records = ([ins(1, "TA", 9001), rec(2, "TA", "COMMIT")]
               + [ins(10 + i, "TB", key) for i, key in enumerate(keys)] + [rec(5010, "TB", "COMMIT")]
               + [ins(5020, "TC", 9002), rec(5021, "TC", "COMMIT")])
    batch = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(batch)
    spark.conf.set(batch, "1000")
    try:
        _captured(tmp_path, spark, store, target_dsn, records)
    finally:
        spark.conf.set(batch, before)

    (path,) = sorted(tmp_path.rglob("lt?????????"))
    assert [group.num_rows for group in (pq.ParquetFile(path).metadata.row_group(i) for i in range(2))] \
        == [trail.FIRST_ROW_GROUP_RECORDS, 5002 - trail.FIRST_ROW_GROUP_RECORDS]
    written = trail.read_file(path)  # checks the count, the rbas and the content digest over the whole file
    assert written["rba"].to_pylist() == list(range(5002))
    assert written["src_rba"].to_pylist() == sorted(written["src_rba"].to_pylist())
    assert [row["id"] for row in map(json.loads, written["after"].to_pylist())] == [9001, *keys, 9002]
    assert written["trans_ind"].to_pylist() == ([trail.WHOLE, trail.BEGIN] + [trail.MIDDLE] * 4998
                                                + [trail.END, trail.WHOLE])
    assert written["copy_line"].null_count == 0
    whole = trail.write_file(tmp_path / "whole" / path.name[:-9], int(path.name[-9:]), written, group="EXT1",
                             log_bsn=Scn(written["log_bsn"][0].as_py()))
    assert (whole.sha256, trail.read_metadata(whole.path)) == (file_sha256(path), trail.read_metadata(path))
