"""A run's trail written by one task (capture.onetask): a log already in commit order (what
a logical replication slot gives: one thread, each transaction's records together, ending
with its COMMIT) in one pass, and an interleaved, multi-thread log (the simulator's: three
threads, savepoints, rollbacks, transactions open across runs) reordered by commit from a
cache of segments: the same trail, checkpoints and counts as the general path that groups
records by transaction, which still takes every log the one task does not handle."""

from __future__ import annotations

import pytest

from capture_kit import committed_trail, ins, load_config, new_archive, rec, state
from trailbound.capture.run import run_extract
from trailbound.metadata import MetadataStore
from trailbound.trail import format as trail

pytestmark = [pytest.mark.spark, pytest.mark.pg]

ONE_PASS = "in commit order (one pass)"
REORDERED = "in commit order (one task)"


def _segments(step: int) -> list[tuple[list[dict], int]]:
    """The log of one thread, segment by segment, for each run (`step`)."""
    if step == 0:
        return [
            ([rec(1, "T1", "BEGIN"), ins(2, "T1", 1), ins(3, "T1", 2), rec(4, "T1", "COMMIT"),
              rec(5, "T2", "BEGIN"), ins(6, "T2", 3), rec(7, "T2", "ROLLBACK"),       # rolled back: no trace
              ins(8, "T3", 4, table="hr.salaries"), rec(9, "T3", "COMMIT"),            # not captured: read only
              ins(10, "T4", 5), ins(11, "T4", 6)], 20),                                # T4 goes on in the next
            ([ins(21, "T4", 7), rec(22, "T4", "COMMIT"),
              rec(23, "T5", "UPDATE", "shop.orders", key=1), rec(24, "T5", "DELETE", "shop.orders", key=2),
              rec(25, "T5", "COMMIT")], 30)]
    if step == 1:  # enough small transactions for several files
        records = []
        for n in range(12):
            scn = 100 + 10 * n
            records += [ins(scn + 1, f"U{n}", 100 + n), rec(scn + 2, f"U{n}", "UPDATE", "shop.orders", key=100 + n),
                        rec(scn + 3, f"U{n}", "COMMIT")]
        return [(records, 300)]
    if step == 2:  # two transactions interleave (their records still come in commit order)
        return [([ins(301, "V1", 200), ins(302, "V2", 201), rec(303, "V1", "COMMIT"), rec(304, "V2", "COMMIT")], 400)]
    if step == 3:  # a subtransaction rolled back to its savepoint: its records are dropped
        return [([ins(401, "S1", 250), ins(402, "S1.1", 251, parent_xid="S1"),
                  rec(403, "S1.1", "ROLLBACK", parent_xid="S1"), rec(404, "S1", "COMMIT")], 450)]
    if step == 4:  # one left open at the horizon (read again from its start by the next run)
        return [([ins(451, "W1", 300), rec(452, "W1", "COMMIT"), ins(453, "W2", 301)], 500)]
    if step == 5:  # W2 goes on and ends, after it another: in commit order again
        return [([ins(501, "W2", 302), rec(502, "W2", "COMMIT"), ins(503, "W3", 303), rec(504, "W3", "COMMIT")], 550)]
    if step == 6:
        return [([ins(551, "W4", 304), ins(552, "W5", 305), rec(553, "W4", "COMMIT"), rec(554, "W5", "COMMIT")], 600)]
    if step == 7:
        return [([ins(601, "W6", 306), rec(602, "W6", "COMMIT"), ins(603, "W7", 307)], 650)]
    return [([ins(651, "W7", 308), rec(652, "W7", "COMMIT")], 700)]


def _trail_bytes(config) -> dict[str, bytes]:
    prefix = config.path(config.extract("EXT1").exttrail)
    return {path.name: path.read_bytes() for path in trail.existing_files(prefix)}


def _checkpoints(store) -> tuple:
    s = state(store)
    return (s.write.position, s.write.last_csn, s.read_scn, {t: str(c.position) for t, c in s.read["current"].items()},
            {t: str(c.position) for t, c in s.read["recovery"].items()},
            [(t.xid, t.records, t.bytes, str(t.start.position), t.start.scn) for t in s.open])


def test_a_log_in_commit_order_is_written_in_one_pass_and_equals_the_grouped_trail(
        tmp_path, spark, store, new_metadata_database):
    one, grouped = tmp_path / "one", tmp_path / "grouped"
    archives = {one: new_archive(one), grouped: new_archive(grouped)}
    configs = {d: load_config(d, megabytes=0.0005) for d in archives}
    with MetadataStore.open(new_metadata_database()) as grouped_store:
        stores = {one: store, grouped: grouped_store}
        paths = []
        for step in range(9):
            for directory, archive in archives.items():
                for records, next_scn in _segments(step):
                    archive.segment(1, records, next_scn)
            results = {d: run_extract(spark, stores[d], configs[d], "EXT1", one_task=d == one)
                       for d in archives}
            paths.append(results[one].assembly)
            assert results[grouped].assembly == "grouped by transaction: one task turned off"
            fields = ("records_read", "transactions_written", "records_written", "open_transactions")
            assert [getattr(results[one], f) for f in fields] == [getattr(results[grouped], f) for f in fields], step
            assert _checkpoints(store) == _checkpoints(grouped_store), step
            assert _trail_bytes(configs[one]) == _trail_bytes(configs[grouped]), step
        # Interleaved transactions (steps 2 and 6) and a savepoint rolled back (3) whose
        # records to write still come in commit order; W2 and W7 left open, then read
        # again from their start.
        assert paths == [ONE_PASS] * 9

        trail_records = committed_trail(store, configs[one])
        assert len(_trail_bytes(configs[one])) > 4  # rolled over
        written = [r["xid"] for r in trail_records if r["trans_ind"] in (trail.BEGIN, trail.WHOLE)]
        assert written == ["T1", "T4", "T5"] + [f"U{n}" for n in range(12)] + ["V1", "V2", "S1"] + [
            f"W{n}" for n in range(1, 8)]
        assert [r["src_rba"] for r in trail_records if r["xid"] == "T4"] == [9, 10, 0]
        assert results[one].open_transactions == 0 and state(store).open == []


def test_a_one_pass_run_killed_at_each_crash_point_then_rerun_gives_the_uninterrupted_trail(
        tmp_path, spark, store, new_metadata_database, crash_driver):
    """The one pass's run killed at each crash point in turn (as test_capture's for the
    grouping): until the checkpoint commits nothing moves, nothing is cataloged before its
    checks end, and the rerun writes the trail of a run never killed."""
    import os
    import subprocess

    from capture_kit import write_config
    from trailbound import config as configuration
    from trailbound.archive.catalog import ArchiveCatalog
    from trailbound.capture.run import CRASH_POINTS
    from trailbound.crash import CRASH_ENV

    killed, reference = tmp_path / "killed", tmp_path / "reference"
    configs = {}
    for directory in (killed, reference):
        archive = new_archive(directory)
        archive.segment(1, _segments(0)[0][0], 20)  # cataloged by the first run
        configs[directory] = configuration.load(write_config(directory, megabytes=0.0005))
    with MetadataStore.open(new_metadata_database()) as reference_store:
        stores = {killed: store, reference: reference_store}
        for directory in (killed, reference):
            assert run_extract(spark, stores[directory], configs[directory], "EXT1").assembly == ONE_PASS
            archive = new_archive(directory)
            archive.next_sequence[1], archive.next_scn[1] = 2, 20
            for records, next_scn in _segments(0)[1:] + _segments(1):  # new segments for the killed runs
                archive.segment(1, records, next_scn)
        assert run_extract(spark, reference_store, configs[reference], "EXT1").assembly == ONE_PASS
        before = state(store)
        env = {**os.environ, "TRAILBOUND_METADATA_DSN": store.connection.dsn, **crash_driver.env}
        for point in [p for p in CRASH_POINTS if "new_version" not in p]:
            crashed = subprocess.run(crash_driver.cli("--config", str(killed / "trailbound.yaml"), "extract", "run",
                                                      "EXT1"), env={**env, CRASH_ENV: point},
                                     capture_output=True, text=True, timeout=300)
            assert crashed.returncode == 137, (point, crashed.stderr[-2000:])
            if point != "after_checkpoint_commit":
                assert (state(store).read_scn, state(store).write) == (before.read_scn, before.write), point
            if point in ("before_trail_write", "mid_trail_write"):  # the new segments' checks end with the job
                assert len(ArchiveCatalog(store, "SRC").entries()) == 1, f"{point}: nothing cataloged yet"
        assert "nothing new" in run_extract(spark, store, configs[killed], "EXT1").describe()
        assert committed_trail(store, configs[killed]) == committed_trail(reference_store, configs[reference])
        assert _trail_bytes(configs[killed]) == _trail_bytes(configs[reference])


def _simulated(directory, **kwargs):
    from trailbound.sources.simulator import simulate

    return simulate(directory / "archive", directory / "truth.json", fmt="parquet", **kwargs)


def _run_both(spark, archives: dict, stores: dict, configs: dict, one, until, **one_task) -> dict:
    """One run of each path (the one task at `one`, the grouping at the other), and their
    results, checkpoints and trails compared."""
    results = {d: run_extract(spark, stores[d], configs[d], "EXT1", until=until, one_task=d == one,
                              **(one_task if d == one else {})) for d in archives}
    grouped = next(d for d in archives if d != one)
    fields = ("records_read", "transactions_written", "records_written", "open_transactions")
    assert [getattr(results[one], f) for f in fields] == [getattr(results[grouped], f) for f in fields], until
    assert _checkpoints(stores[one]) == _checkpoints(stores[grouped]), until
    assert _trail_bytes(configs[one]) == _trail_bytes(configs[grouped]), until
    return results


def test_a_simulated_multi_thread_log_is_written_by_one_task_and_equals_the_grouped_trail(
        tmp_path, spark, store, new_metadata_database):
    """Three threads with interleaved transactions, savepoints rolled back, rolled-back
    transactions, transactions open across runs and several trail files: the one task
    reorders the records by commit and writes the grouping's trail byte for byte."""
    from datetime import timedelta

    one, grouped = tmp_path / "one", tmp_path / "grouped"
    summaries = [_simulated(d, records=8_000, hours=8, seed=5) for d in (one, grouped)]
    summary = summaries[0]
    assert summary.features["rolled_back_savepoints"] > 0 and summary.rolled_back > 0 and len(summary.segments) == 3
    configs = {d: load_config(d, tables=("shop.*", "hr.*"), megabytes=0.05) for d in (one, grouped)}
    with MetadataStore.open(new_metadata_database()) as grouped_store:
        stores = {one: store, grouped: grouped_store}
        runs = []
        # Before Bounded Recovery's first boundary (4 h of log time): a run after it would restore
        # persisted transactions, which the one task leaves to the grouping.
        for until in [summary.first_time + timedelta(hours=h) for h in (1, 2, 3.5)] + [None]:
            results = _run_both(spark, configs, stores, configs, one, until)
            runs.append(results[one])
            assert results[grouped].assembly == "grouped by transaction: one task turned off"
        assert all(r.assembly == REORDERED for r in runs), [r.assembly for r in runs]
        assert all(r.transactions_written > 0 for r in runs)
        assert any(r.open_transactions > 0 for r in runs[:-1])  # open across runs, read again from their start
        assert len(_trail_bytes(configs[one])) > 3  # rolled over
        assert len({r["src_thread"] for r in committed_trail(store, configs[one])}) == 3


def test_a_tiny_cache_budget_reads_segments_again_and_writes_the_same_trail(tmp_path, spark, store,
                                                                           new_metadata_database):
    """The one task's cache of decoded segments held to a few KB: segments are dropped
    before their last record to write is out and read again, and the trail is the
    grouping's all the same."""
    one, grouped = tmp_path / "one", tmp_path / "grouped"
    for directory in (one, grouped):
        _simulated(directory, records=3_000, hours=3, seed=9, segment_minutes=5)
    configs = {d: load_config(d, tables=("shop.*", "hr.*"), megabytes=0.05) for d in (one, grouped)}
    with MetadataStore.open(new_metadata_database()) as grouped_store:
        results = _run_both(spark, configs, {one: store, grouped: grouped_store}, configs, one, None,
                            cache_bytes=20_000)
    assert results[one].assembly.startswith(REORDERED + ", ") and "segment reads again" in results[one].assembly, \
        results[one].assembly
