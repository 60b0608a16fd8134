"""Capture (Extract) runs on hand-written archives: commit order, rollbacks, long open
transactions, recovery, idempotence, crashes at every named point, bad input."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from capture_kit import (at, committed_trail, ins, load_config, new_archive, rec, state, transactions,
                         write_config)
from trailbound import cli
from trailbound import config as configuration
from trailbound.trail import format as trail
from trailbound.capture.run import CRASH_POINTS, run_extract
from trailbound.crash import CRASH_ENV
from trailbound.errors import ArchiveError
from trailbound.metadata import MetadataStore
from trailbound.positions import LogPosition, Scn

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def run(spark, store, config, until=None):
    return run_extract(spark, store, config, "EXT1", until=until)


def test_commit_order_across_three_threads(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), rec(50, "T1", "COMMIT")], 100)
    archive.segment(2, [ins(20, "T2", 2), rec(50, "T2", "COMMIT")], 100, fmt="jsonl")
    archive.segment(3, [ins(30, "T3", 3), rec(40, "T3", "COMMIT"), ins(41, "T4", 4), ins(42, "T4", 5),
                        rec(50, "T4", "COMMIT")], 100)
    config = load_config(tmp_path)
    result = run(spark, store, config)
    records = committed_trail(store, config)
    # T3 commits first; T1, T2 and T4 share commit scn 50 and are ordered by thread.
    assert transactions(records) == [("T3", [3]), ("T1", [1]), ("T2", [2]), ("T4", [4, 5])]
    assert [r["csn"] for r in records] == [40, 50, 50, 50, 50]
    assert [r["trans_ind"] for r in records] == [trail.WHOLE, trail.WHOLE, trail.WHOLE, trail.BEGIN, trail.END]
    assert [r["rba"] for r in records] == [0, 1, 2, 3, 4]
    assert records[3]["src_thread"] == 3 and records[3]["src_sequence"] == 1 and records[3]["src_rba"] == 2
    assert result.transactions_written == 4 and result.open_transactions == 0


def test_rollbacks_and_rolled_back_savepoints_leave_no_trace(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    archive.segment(1, [
        rec(1, "T1", "BEGIN"), ins(2, "T1", 1),
        ins(3, "S1", 2, parent_xid="T1"), rec(4, "S1", "ROLLBACK", parent_xid="T1"),    # rolled-back savepoint
        ins(5, "S2", 3, parent_xid="T1"),                                               # released: kept
        # A savepoint inside a savepoint: parent_xid names the top-level transaction.
        ins(6, "S3", 4, parent_xid="T1"), ins(7, "S4", 5, parent_xid="T1"),
        ins(8, "T2", 6), rec(9, "T2", "ROLLBACK"),                                       # whole rollback
        rec(10, "S4", "ROLLBACK", parent_xid="T1"), rec(10, "S3", "ROLLBACK", parent_xid="T1"),  # nested
        ins(11, "T1", 7), rec(12, "T1", "COMMIT")], 100)
    config = load_config(tmp_path)
    result = run(spark, store, config)
    assert transactions(committed_trail(store, config)) == [("T1", [1, 3, 7])]
    assert result.open_transactions == 0 and state(store).open == [], "nothing may stay open"
    assert state(store).read["recovery"][1].scn == Scn(12), "no open transaction holds recovery back"


@pytest.mark.long_running(50)
def test_a_transaction_open_across_many_runs_is_written_once_whole(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    config = load_config(tmp_path)
    # L starts in segment 1, adds a row in every segment, commits in segment 8; a short
    # transaction commits in every segment.
    for n in range(1, 9):
        base = n * 100
        records = [ins(base - 90, f"S{n}", 1000 + n), rec(base - 80, f"S{n}", "COMMIT"), ins(base - 50, "L", n)]
        if n == 8:
            records.append(rec(base - 10, "L", "COMMIT"))
        archive.segment(1, records, base)
    for n in range(1, 8):
        run(spark, store, config, until=at(n * 100))
        written = transactions(committed_trail(store, config))
        assert "L" not in [xid for xid, _ in written]
        st = state(store)
        [long_one] = [t for t in st.open if t.xid == "L"]
        assert (long_one.start.position, long_one.start.scn) == (LogPosition(1, 1, 2), Scn(50))
        assert st.read["recovery"][1].scn == Scn(50), "recovery restarts at the oldest open transaction"
    run(spark, store, config, until=at(800))
    run(spark, store, config)  # and again: nothing may be written twice
    written = transactions(committed_trail(store, config))
    assert written == [(f"S{n}", [1000 + n]) for n in range(1, 9)][:8] + [("L", list(range(1, 9)))] \
        or written == [*[(f"S{n}", [1000 + n]) for n in range(1, 9)], ("L", list(range(1, 9)))]
    assert [xid for xid, _ in written].count("L") == 1
    assert state(store).open == []


def test_reruns_are_idempotent(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "B", 2)], 100)
    archive.segment(1, [rec(110, "B", "COMMIT")], 200)
    config = load_config(tmp_path)
    run(spark, store, config, until=at(100))
    first = committed_trail(store, config)
    assert "nothing new" in run(spark, store, config, until=at(100)).describe()
    assert committed_trail(store, config) == first
    run(spark, store, config)
    whole = committed_trail(store, config)
    run(spark, store, config)
    assert committed_trail(store, config) == whole
    assert transactions(whole) == [("A", [1]), ("B", [2])]


def test_table_selection_still_tracks_transactions_it_does_not_write(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "HR", 1, table="hr.salaries"), ins(20, "MIX", 2, table="hr.salaries"),
                        ins(21, "MIX", 3), rec(22, "MIX", "COMMIT")], 100)
    archive.segment(1, [rec(110, "HR", "COMMIT")], 200)
    config = load_config(tmp_path)
    run(spark, store, config, until=at(100))
    assert [t.xid for t in state(store).open] == ["HR"]  # open, though it touches no selected table
    assert state(store).read["recovery"][1].scn == Scn(10)
    run(spark, store, config)
    assert transactions(committed_trail(store, config)) == [("MIX", [3])]
    assert state(store).open == []


def test_trail_files_roll_over_between_transactions(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    records = []
    for n in range(40):
        records += [ins(10 * n + 1, f"T{n}", 2 * n), ins(10 * n + 2, f"T{n}", 2 * n + 1), rec(10 * n + 3, f"T{n}", "COMMIT")]
    archive.segment(1, records, 1000)
    config = load_config(tmp_path, megabytes=0.002)
    result = run(spark, store, config)
    assert len(result.files) > 3
    records = committed_trail(store, config)
    assert len(records) == 80
    for seqno in {r["seqno"] for r in records}:
        in_file = [r for r in records if r["seqno"] == seqno]
        assert [r["rba"] for r in in_file] == list(range(len(in_file)))
        assert in_file[0]["trans_ind"] == trail.BEGIN and in_file[-1]["trans_ind"] == trail.END
    for path in trail.existing_files(config.path(config.extract("EXT1").exttrail)):
        meta = trail.read_metadata(path)
        assert meta["format_version"] == trail.FORMAT_VERSION and meta["records"] == len(trail.read_file(path))


def m(n: int) -> int:
    """The crash scenario's SCNs are minutes of log time, so that its runs cross Bounded
    Recovery boundaries (brinterval 20m, the shortest allowed)."""
    return n * 60


def _crash_scenario(tmp_path):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(m(10), "A", 1), rec(m(20), "A", "COMMIT"), ins(m(90), "LONG", 2)], m(100))
    archive.segment(2, [ins(m(40), "B", 3), ins(m(41), "B", 4), rec(m(60), "B", "COMMIT")], m(100), fmt="jsonl")
    archive.segment(1, [ins(m(110), "C", 5), rec(m(120), "C", "COMMIT"), ins(m(130), "LONG", 6)], m(200))
    archive.segment(2, [ins(m(150), "D", 7), rec(m(160), "D", "COMMIT")], m(200))
    archive.segment(1, [rec(m(210), "LONG", "COMMIT"), ins(m(220), "E", 8), rec(m(230), "E", "COMMIT")], m(300))
    archive.segment(2, [], m(300))
    # Tiny trail files (one transaction each), so a run writes several and can die between
    # them; Bounded Recovery (brinterval 20m, rounded up to the extract's interval) first
    # persists LONG in the second run (open for 110 minutes by then, 10 in the first).
    path = write_config(tmp_path, megabytes=0.0001)
    path.write_text(path.read_text() + "    br:\n      brdir: brfiles\n      brinterval: 20m\n")
    return path


def _br_files(directory) -> list:
    return sorted(p.name for p in (directory / "brfiles").rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def uninterrupted_trail(tmp_path_factory, spark, new_metadata_database):
    from trailbound import config as configuration

    directory = tmp_path_factory.mktemp("reference")
    config = configuration.load(_crash_scenario(directory))
    with MetadataStore.open(new_metadata_database()) as reference_store:
        run(spark, reference_store, config, at(m(100)))
        assert _br_files(directory) == []
        assert run(spark, reference_store, config, at(m(200))).br_checkpoint and _br_files(directory), \
            "the second run persists LONG"
        assert run(spark, reference_store, config, at(m(300))).recovery == "bounded"
        return committed_trail(reference_store, config)


@pytest.mark.long_running(110)
def test_a_crash_at_every_point_in_turn_then_a_rerun_gives_the_uninterrupted_trail(tmp_path, spark, store,
                                                                                   uninterrupted_trail, crash_driver):
    """The second run is killed at each crash point in turn (the order the run reaches
    them), each kill in a run that first recovers from the kills before it, as a machine
    that keeps failing would. Until the checkpoint commits nothing may move; then the
    remaining runs give exactly the trail of the runs that were never killed."""
    from trailbound import config as configuration

    config_path = _crash_scenario(tmp_path)
    config = configuration.load(config_path)
    run(spark, store, config, at(m(100)))
    before = state(store)
    env = {**os.environ, "TRAILBOUND_METADATA_DSN": store.connection.dsn, **crash_driver.env}
    # The version-change points need an archive whose tables change (the crash matrix's).
    for point in [p for p in CRASH_POINTS if "new_version" not in p]:
        crashed = subprocess.run(crash_driver.cli("--config", str(config_path), "extract", "run", "EXT1",
                                                   "--until", at(m(200)).isoformat()),
                                 env={**env, CRASH_ENV: point}, capture_output=True, text=True, timeout=300)
        assert crashed.returncode == 137, (point, crashed.stderr[-2000:])
        after = state(store)
        if point == "after_checkpoint_commit":
            assert after.read_scn == Scn(m(200)), point
        else:
            assert (after.read_scn, after.write) == (before.read_scn, before.write), f"{point}: no checkpoint may move"
        if CRASH_POINTS.index(point) < CRASH_POINTS.index("after_br_persist"):
            assert _br_files(tmp_path) == [], f"{point} comes before the BR persist"
        else:
            assert _br_files(tmp_path), f"{point}: the crashed run got as far as writing its BR file"
    assert "nothing new" in run(spark, store, config, at(m(200))).describe(), "the last kill came after the commit"
    assert run(spark, store, config, at(m(300))).recovery == "bounded", \
        "the killed run committed its BR checkpoint with its read checkpoint"
    assert committed_trail(store, config) == uninterrupted_trail
    assert transactions(uninterrupted_trail) == [("A", [1]), ("B", [3, 4]), ("C", [5]), ("D", [7]),
                                                 ("LONG", [2, 6]), ("E", [8])]
    assert len({r["seqno"] for r in uninterrupted_trail}) == 6


def test_a_record_after_commit_across_runs_stops_capture_and_moves_nothing(tmp_path, spark, store):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), ins(15, "OPEN", 9), rec(20, "A", "COMMIT")], 100)
    config = load_config(tmp_path)
    run(spark, store, config)
    before = state(store)
    bad = archive.segment(1, [ins(110, "OPEN", 10), rec(115, "OPEN", "COMMIT"), ins(120, "OPEN", 11)], 200)
    with pytest.raises(ArchiveError) as error:
        run(spark, store, config)
    assert error.value.path.endswith("arch_1_000000002.parquet") and error.value.rba == 2
    assert "record of transaction OPEN after its COMMIT at sequence 2 rba 1" in str(error.value)
    after = state(store)
    assert (after.read_scn, after.write, after.open) == (before.read_scn, before.write, before.open)
    assert bad.exists()


def test_a_run_failing_after_its_spark_work_gives_back_its_cache_and_moves_nothing(tmp_path, spark, store):
    """A Spark Connect server's cache is shared by its sessions and outlives them: a run
    that fails (here: its trail directory cannot be made) must uncache what it cached, or
    a long-lived server keeps it until restarted."""
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT")], 100)
    config = load_config(tmp_path)
    (tmp_path / "dirdat").write_text("a file where the trail's directory goes")
    cache = spark._jsparkSession.sharedState().cacheManager()   # the JVM's, shared by every session
    spark.catalog.clearCache()
    with pytest.raises(OSError) as error:
        run(spark, store, config)
    assert str(tmp_path / "dirdat") in str(error.value)
    assert cache.isEmpty(), "the failed run uncached its frames"
    assert committed_trail(store, config) == [], "nothing committed"


def test_alter_extract_begin_is_refused_while_a_run_holds_the_group(tmp_path, spark, store, group_held_elsewhere, capsys,
                                                                   monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "INFLIGHT", 2)], 100)
    archive.segment(1, [ins(110, "B", 3), rec(120, "INFLIGHT", "COMMIT"), rec(130, "B", "COMMIT")], 200)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    with group_held_elsewhere("extract", "EXT1"):
        assert cli.main(["--config", str(config_path), "add", "extract", "EXT1"]) == 0
        assert cli.main(["--config", str(config_path), "alter", "extract", "EXT1", "begin", "scn", "100"]) == 1
        assert "held by a running capture" in capsys.readouterr().err
    assert cli.main(["--config", str(config_path), "alter", "extract", "EXT1", "begin", "scn", "100"]) == 0
    run(spark, store, load_config(tmp_path))
    # INFLIGHT started before scn 100: never written; B started after: written.
    assert transactions(committed_trail(store, load_config(tmp_path))) == [("B", [3])]


def test_info_showch_and_logdump(tmp_path, spark, store, capsys, monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "a/../b", 1), rec(20, "a/../b", "COMMIT"), ins(30, "OPEN", 2)], 100)
    config_path = write_config(tmp_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    assert cli.main(["--config", str(config_path), "extract", "run", "EXT1"]) == 0
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), "info", "extract", "ext1", "--showch", "3"]) == 0
    shown = capsys.readouterr().out
    for expected in ("Status STOPPED", "Startup Checkpoint", "Recovery Checkpoint", "Current Checkpoint",
                     "Sequence #: 1", "SCN: 30", "Write Checkpoint #1", "Last CSN: 20@1:1:1", "Checkpoint history"):
        assert expected in shown
    trail_file = tmp_path / "dirdat" / "lt000000001"
    assert cli.main(["logdump", str(trail_file), "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert record | {"commit_ts": None} == {"seqno": 1, "rba": 0, "trans_ind": 3, "csn": "20@1:1:1", "xid": "a/../b",
                                            "commit_ts": None, "op": "INSERT", "table": "shop.orders",
                                            "table_version": 1, "before": None, "after": '{"id":1,"note":"n1"}'}


@pytest.mark.long_running(75)
def test_capture_of_the_simulated_source_reproduces_its_truth(tmp_path, spark, store):
    """Many runs over a simulated busy source (3 threads, savepoints, long and open
    transactions, hostile xids, TRUNCATE, pk updates): replaying the trail in order gives
    exactly the simulator's committed state."""
    from datetime import timedelta

    from replay_kit import apply_change, canonical
    from trailbound.sources.simulator import simulate

    summary = simulate(tmp_path / "archive", tmp_path / "truth.json", records=30_000, hours=12, seed=11)
    config = load_config(tmp_path, tables=("shop.*", "hr.*"), megabytes=1)
    for hour in (3, 5, 9):
        run(spark, store, config, until=summary.first_time + timedelta(hours=hour))
    run(spark, store, config)
    truth = json.loads((tmp_path / "truth.json").read_text())
    keys = {name: table["key"] for name, table in truth["tables"].items()}
    columns = {name: table["columns"] for name, table in truth["tables"].items()}
    state_by_table = {name: {} for name in truth["tables"]}
    records = committed_trail(store, config)
    xids = [xid for xid, _ in _transactions_any_key(records)]
    assert len(xids) == len(set(xids)), "no transaction is written twice"
    assert sum(1 for x in xids if not x.isalnum()) > 0, "hostile xids made it through"
    for record in records:
        apply_change(state_by_table, keys, columns, record)
    for name, table in truth["tables"].items():
        assert canonical(list(state_by_table[name].values())) == canonical(table["rows"]), name
    assert len(state(store).open) == truth["transactions"]["open_at_end"]


def _transactions_any_key(records):
    out = []
    for record in records:
        if record["trans_ind"] in (trail.BEGIN, trail.WHOLE):
            out.append((record["xid"], []))
    return out


@pytest.mark.parametrize("defect", ["sha256", "sequence gap", "scn backwards", "unknown op", "commit of a savepoint"])
def test_bad_input_stops_capture_with_the_file_and_moves_no_checkpoint(tmp_path, spark, store, defect):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "OPEN", 2)], 100)
    config = load_config(tmp_path)
    run(spark, store, config)
    before = state(store)
    trail_before = committed_trail(store, config)
    records = [ins(110, "B", 3), rec(120, "B", "COMMIT")]
    expected_rba = None
    # Each bad record sits before B's COMMIT, where no other check can fire: the error
    # must come from the check the case is about.
    if defect == "sha256":
        archive.segment(1, records, 200, manifest_overrides={"sha256": "f" * 64})
        name, message = "arch_1_000000002.parquet", "the manifest says " + "f" * 64
    elif defect == "sequence gap":
        archive.next_sequence[1] = 3
        archive.segment(1, records, 200)
        name, message = "arch_1_000000003.json", "sequence gap: thread 1 goes from sequence 1 to 3 (missing 2)"
    else:
        bad, message = {
            "scn backwards": ([ins(105, "B", 4)], "scn goes backwards: 105 after 110"),
            "unknown op": ([rec(111, "B", "UPSERT", "shop.orders", key=4)], "unknown op UPSERT"),
            "commit of a savepoint": ([ins(111, "S", 4, parent_xid="B"), rec(112, "S", "COMMIT", parent_xid="B")],
                                      "COMMIT of subtransaction S (of transaction B)"),
        }[defect]
        archive.segment(1, records[:1] + bad + records[1:], 200, fmt="jsonl")
        name, expected_rba = "arch_1_000000002.jsonl", len(bad)
    with pytest.raises(ArchiveError) as error:
        run(spark, store, config)
    assert error.value.path.endswith(name) and error.value.rba == expected_rba
    assert message in error.value.message, error.value.message
    after = state(store)
    assert (after.read_scn, after.write, after.open, after.read) == (before.read_scn, before.write, before.open,
                                                                      before.read)
    assert committed_trail(store, config) == trail_before


def test_begin_now_and_begin_an_iso_time(tmp_path, spark, store, capsys, monkeypatch):
    """`now` begins at the horizon: transactions in flight there are never written. A
    time begins at the first segment that ends after it (a naive time is UTC)."""
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "INFLIGHT", 2)], 100)
    archive.segment(1, [ins(110, "B", 3), rec(120, "INFLIGHT", "COMMIT"), rec(130, "B", "COMMIT")], 200)
    config_path = write_config(tmp_path)
    config = configuration.load(config_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    assert main("archive", "scan") == 0
    assert main("add", "extract", "EXT1", "--begin", "now") == 0
    assert "begin now (scn 200)" in capsys.readouterr().out
    archive.segment(1, [ins(210, "C", 4), rec(220, "C", "COMMIT")], 300)
    run_extract(spark, store, config, "EXT1")
    assert transactions(committed_trail(store, config)) == [("C", [4])]

    assert main("delete", "extract", "EXT1") == 0
    for path in (tmp_path / "dirdat").iterdir():
        path.unlink()
    with store.transaction() as cur:
        cur.execute("DELETE FROM trailbound.trail_file")
    naive = at(100).replace(tzinfo=None).isoformat()  # 2026-11-01T00:01:40, read as UTC
    assert main("add", "extract", "EXT1", "--begin", naive) == 0
    assert f"begin {naive} (scn 100)" in capsys.readouterr().out
    run_extract(spark, store, config, "EXT1")
    # INFLIGHT began at scn 30, before the begin point: never written; B and C are.
    assert transactions(committed_trail(store, config)) == [("B", [3]), ("C", [4])]
    assert main("alter", "extract", "EXT1", "begin", at(250).isoformat()) == 0
    assert f"begin {at(250).isoformat()} (scn 200)" in capsys.readouterr().out
    assert main("alter", "extract", "EXT1", "begin", "yesterday") == 1
    assert "begin 'yesterday': expected earliest | now | an ISO-8601 time | scn N" in capsys.readouterr().err


def test_a_large_segment_is_read_a_part_at_a_time(tmp_path, monkeypatch):
    """A reading task holds about one part of the log (logread._RECORDS_PER_PART records)
    however large a segment, or the transaction in it, is: every record once, in log
    order, small segments still read together."""
    import pyarrow as pa

    from trailbound.capture import logread

    monkeypatch.setattr(logread, "_RECORDS_PER_PART", 1000)
    archive = new_archive(tmp_path)
    large = archive.segment(1, [ins(i, "BIG", i) for i in range(2500)] + [rec(2500, "BIG", "COMMIT")], 2501)
    small = archive.segment(1, [ins(2501, "S", 1), rec(2502, "S", "COMMIT")], 2503)
    chunk = [logread._Input(str(large.with_suffix(".parquet")), 1, 1, 2501, False),
             logread._Input(str(small.with_suffix(".parquet")), 1, 2, 2, False)]
    parts = list(logread._read_parts(chunk, logread.ReadWindow(Scn(10**6))))
    assert [len(part) for part in parts] == [1000, 1000, 503], "the large one in parts, its tail with the small one"
    records = pa.concat_tables(parts)
    assert list(zip(records["sequence"].to_pylist(), records["rba"].to_pylist())) == \
        [(1, rba) for rba in range(2501)] + [(2, 0), (2, 1)]
    assert records["txid"].to_pylist() == ["BIG"] * 2501 + ["S"] * 2
