"""Archive-log retention: the policy on its own (pure), the required SCN a capture
publishes, and retention runs against real captures (PostgreSQL and Spark) over
hour-scale archives: one SCN per second, one segment per thread per hour."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg2 import sql

from capture_kit import at, committed_trail, state, transactions
from retention_kit import (HOUR, back_up, catalog_rows, expected_transactions, files_on_disk, hourly_archive, hours,
                           purged, registration, restore, run, segment_files, write_config)
from trailbound import cli
from trailbound import config as configuration
from trailbound.archive.catalog import AVAILABLE, PURGED, ArchiveCatalog, CatalogEntry
from trailbound.archive.segments import Segment
from trailbound.capture import recovery
from trailbound.capture.checkpoints import BrCheckpoint, ExtractState, OpenTransaction, PersistedObject, ReadCheckpoint
from trailbound.crash import CRASH_ENV
from trailbound.errors import ArchiveError, ConfigError
from trailbound.positions import LogPosition, Scn
from trailbound.retention import Registration, plan_retention, register, run_retention


# ---------------------------------------------------------------- the policy, pure

def entry(thread: int, sequence: int, *, records: int = 1, size: int = 100, backed: int = 0,
          restored: bool = False, state_: str = AVAILABLE) -> CatalogEntry:
    """Segment `sequence` covers hour sequence-1 (scn hours(sequence-1)..hours(sequence))."""
    first, nxt = hours(sequence - 1), hours(sequence)
    segment = Segment(thread, sequence, Scn(first), Scn(nxt), at(first), at(nxt), records, size, "0" * 64, "parquet",
                      Path(f"/archive/arch_{thread}_{sequence:09d}.parquet"))
    return CatalogEntry(segment, state_, at(0), backed_up_count=backed, restored_at=at(0) if restored else None)


def reg(group: str, required: int, read: int | None = -1, *, enabled: bool = True) -> Registration:
    read_scn = required if read == -1 else read
    return Registration(group, "SRC", Scn(0), Scn(required), None if read_scn is None else Scn(read_scn), enabled)


def policy(**options) -> configuration.RetentionConfig:
    return configuration.RetentionConfig(**{"minkeephours": 0, **options})


def thread(n: int, count: int = 6, **kwargs) -> list[CatalogEntry]:
    return [entry(n, s, **kwargs) for s in range(1, count + 1)]


def verdicts(plan) -> dict[tuple[int, int], str]:
    return {(d.segment.thread, d.segment.sequence): ("forced" if d.forced else "purge" if d.purge else "keep")
            for d in plan.decisions}


def test_nothing_is_purged_without_a_registration():
    plan = plan_retention("SRC", thread(1), [], policy())
    assert plan.purged == [] and plan.required_scn is None
    assert all("no capture of source SRC is registered" in d.reason for d in plan.kept)


def test_purges_at_or_below_the_required_scn_and_says_why_the_rest_stays():
    plan = plan_retention("SRC", thread(1), [reg("EXT1", hours(3), read=hours(5))], policy())
    assert verdicts(plan) == {(1, 1): "purge", (1, 2): "purge", (1, 3): "purge",   # next_scn 3h <= required 3h
                              (1, 4): "keep", (1, 5): "keep", (1, 6): "keep"}
    assert {d.allowing_scn for d in plan.purged} == {Scn(hours(3))}
    assert "below required scn 10800" in plan.purged[0].reason
    why = {d.segment.sequence: d.reason for d in plan.kept}
    assert why[4] == why[5] == f"needed by extract EXT1 from scn {hours(3)}"
    assert why[6] == f"not read yet by extract EXT1 (read below scn {hours(5)})"
    assert [d.needed_by for d in plan.kept] == [("EXT1",)] * 3


def test_one_scn_below_a_boundary_keeps_the_segment_that_holds_it():
    plan = plan_retention("SRC", thread(1), [reg("EXT1", hours(3) - 1, read=hours(6))], policy())
    assert [d.segment.sequence for d in plan.purged] == [1, 2]


def test_the_lowest_of_two_captures_wins_and_only_it_is_named():
    plan = plan_retention("SRC", thread(1) + thread(2),
                          [reg("EXT1", hours(5)), reg("EXT2", hours(2) + 1800, read=hours(4)),
                           reg("OLD", 0, enabled=False)],
                          policy())
    assert plan.required_scn == Scn(hours(2) + 1800)
    assert sorted((d.segment.thread, d.segment.sequence) for d in plan.purged) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    why = {(d.segment.thread, d.segment.sequence): d.reason for d in plan.kept}
    assert why[(1, 3)] == f"needed by extract EXT2 from scn {hours(2) + 1800}", "EXT1 is past sequence 3"
    assert "EXT1" in why[(1, 6)] and "EXT2" in why[(1, 6)]
    assert all("OLD" not in d.reason for d in plan.decisions), "an unregistered capture holds nothing"


def test_a_capture_that_never_ran_keeps_everything():
    plan = plan_retention("SRC", thread(1), [reg("EXT1", hours(6)), reg("NEW", 0, read=None)], policy())
    assert plan.purged == []
    assert all("extract NEW has not run yet" in d.reason for d in plan.kept)


def test_minkeephours_keeps_the_newest_hours_of_log_time():
    plan = plan_retention("SRC", thread(1) + thread(2, count=4), [reg("EXT1", hours(6))], policy(minkeephours=2.5))
    # The archive reaches hour 6; segments ending after hour 3.5 stay, on every thread.
    assert [(d.segment.thread, d.segment.sequence) for d in plan.purged] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2),
                                                                             (2, 3)]
    assert {d.reason for d in plan.kept} == {"within the newest 2.5 hour(s) of log (minkeephours)"}


def test_backedup_keeps_segments_until_backed_up_often_enough():
    entries = [entry(1, 1, backed=2), entry(1, 2, backed=1), entry(1, 3, backed=2), entry(1, 4)]
    plan = plan_retention("SRC", entries, [reg("EXT1", hours(6))], policy(backedup=2))
    assert verdicts(plan) == {(1, 1): "purge", (1, 2): "keep", (1, 3): "purge", (1, 4): "keep"}
    assert plan.kept[0].reason == "backed up 1 of 2 time(s) (backedup)"


def test_space_limit_purges_the_oldest_even_if_needed_and_says_so():
    entries = thread(1, size=1000) + thread(2, records=0, size=10)
    plan = plan_retention("SRC", entries, [reg("EXT1", hours(2) + 1800, read=hours(6))], policy(maxbytes=3035))
    # Normal purge: sequences 1-2 of both threads. 4000 + 40 bytes stay; over 3035 the
    # oldest go, thread 1 before thread 2 at equal times, until at most 3035 remain.
    assert verdicts(plan) == {(1, 1): "purge", (1, 2): "purge", (1, 3): "forced", (1, 4): "keep", (1, 5): "keep",
                              (1, 6): "keep", (2, 1): "purge", (2, 2): "purge", (2, 3): "forced", (2, 4): "keep",
                              (2, 5): "keep", (2, 6): "keep"}
    assert plan.remaining_bytes == 3030 and plan.over_limit() is None
    forced = {(d.segment.thread, d.segment.sequence): d for d in plan.forced}
    assert forced[(1, 3)].needed_by == ("EXT1",) and forced[(1, 3)].allowing_scn is None
    assert forced[(2, 3)].needed_by == (), "a segment with no record is never needed"
    assert forced[(1, 3)].reason.startswith("space: 4040 bytes would stay, over maxbytes 3035; oldest first, although "
                                                "kept for: needed by extract EXT1")
    alert = plan.alert("/archive")
    assert "arch_1_000000003.parquet" in alert and "arch_2_000000003" not in alert
    assert f"needed by EXT1 (from scn {hours(2) + 1800})" in alert and "/archive" in alert and "restore" in alert
    assert plan.needs_restore() == {"EXT1": [forced[(1, 3)]]}


def test_space_limit_spares_what_cannot_be_restored_and_what_was_just_restored():
    entries = [entry(1, 1, size=1000), entry(1, 2, size=1000, restored=True, backed=1),
               entry(1, 3, size=1000, backed=1),
               entry(1, 4, size=1000, backed=1)]
    plan = plan_retention("SRC", entries, [reg("EXT1", 0, read=hours(4))], policy(maxbytes=1500, backedup=1))
    # 1 is not backed up (no backup to restore from), 2 was restored for EXT1, which still needs it.
    assert verdicts(plan) == {(1, 1): "keep", (1, 2): "keep", (1, 3): "forced", (1, 4): "forced"}
    assert plan.remaining_bytes == 2000 and "still holds 2000 bytes, over maxbytes 1500" in plan.over_limit()


def test_segments_already_gone_are_purged_again_and_hold_no_space():
    plan = plan_retention("SRC", thread(1, size=1000), [reg("EXT1", hours(2), read=hours(6))],
                          policy(maxbytes=3000), gone={(1, 2), (1, 4)})
    assert [(d.segment.sequence, d.gone) for d in plan.purged] == [(1, False), (2, True)]
    assert plan.archive_bytes == 4000 and plan.remaining_bytes == 3000 and plan.forced == []


def test_purged_segments_are_not_decided_again():
    entries = [entry(1, 1, state_=PURGED), entry(1, 2)]
    plan = plan_retention("SRC", entries, [reg("EXT1", hours(6))], policy())
    assert [(d.segment.sequence, d.purge) for d in plan.decisions] == [(2, True)]


def test_retention_options_are_checked_and_sizes_parsed(tmp_path):
    path = write_config(tmp_path, retention="  minkeephours: 8\n  backedup: 1\n  maxbytes: 20G\n")
    assert configuration.load(path).retention.maxbytes == 20 * 1024 ** 3
    assert configuration.load(write_config(tmp_path)).retention == configuration.RetentionConfig(
        minkeephours=8, backedup=0, maxbytes=None)
    for bad, key in (("  minkeephour: 8\n", "retention.minkeephour: unknown option"),
                     ("  maxbytes: lots\n", "retention.maxbytes"), ("  backedup: -1\n", "retention.backedup")):
        with pytest.raises(ConfigError, match=key):
            configuration.load(write_config(tmp_path, retention=bad))


# ---------------------------------------------------------------- the required SCN a capture publishes

def _open(xid: str, start: int, *, skip: str | None = None, persisted: bool = False) -> OpenTransaction:
    obj = PersistedObject(Path(f"/br/{xid}"), "0" * 64, 3, LogPosition(1, 1, 2), Scn(hours(4))) if persisted else None
    return OpenTransaction(xid, 1, ReadCheckpoint(LogPosition(1, 1, 0), Scn(start), at(start)), 3, 30, skip, obj)


def _state(read_scn, open_=(), checkpoint_scn: int | None = None, begin: int = 500) -> ExtractState:
    checkpoint = BrCheckpoint(1, Scn(checkpoint_scn), at(checkpoint_scn), HOUR, "shop.*", {}, 1, 10) \
        if checkpoint_scn is not None else None
    return ExtractState("EXT1", "SRC", Path("/t/lt"), Scn(begin), f"scn {begin}", "shop.*",
                        None if read_scn is None else Scn(read_scn), open=list(open_), br_checkpoint=checkpoint)


def _required(state_: ExtractState, br_usable: bool) -> int:
    plan = recovery.committed_plan(state_) if br_usable else recovery.RecoveryPlan(recovery.NORMAL, [])
    return recovery.required_scn(state_, plan).value


def test_required_scn_before_the_first_run_is_the_begin_point():
    assert _required(_state(None), True) == 500


def test_required_scn_is_the_oldest_open_transaction_that_will_be_written():
    state_ = _state(hours(6), [_open("A", hours(3)), _open("B", hours(1), skip="skiptrans"), _open("C", hours(5))])
    assert _required(state_, True) == hours(3), "a skipped transaction is never re-read"
    assert _required(_state(hours(6)), True) == hours(6), "nothing open: the read position"


def test_required_scn_with_bounded_recovery_is_the_restart_bounded_recovery_uses():
    open_ = [_open("OLD", hours(1), persisted=True), _open("YOUNG", hours(4) + 600)]
    with_br = _state(hours(6), open_, checkpoint_scn=hours(5))
    assert _required(with_br, True) == hours(4) + 600
    assert _required(_state(hours(6), open_[:1], checkpoint_scn=hours(5)), True) == hours(5)
    assert _required(with_br, False) == hours(1), "BR not usable: the true start"
    assert _required(_state(hours(6), open_), True) == hours(1), "no BR checkpoint: nothing to restore"


# ---------------------------------------------------------------- retention runs with real captures

@pytest.fixture
def cli_env(store, monkeypatch):
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)


def trailbound(config_path: Path, *words: str) -> int:
    return cli.main(["--config", str(config_path), *words])


def snapshot(store, tmp_path: Path) -> dict:
    """Everything a run could change: catalog, registrations, retention log, checkpoints,
    open transactions, run history, archive files, trail files."""
    tables = {}
    with store.transaction() as cur:
        for table, order in (("archive_segment", "source, thread, sequence"), ("capture_registration", "group_name"),
                             ("retention_run", "run_id"), ("extract_group", "group_name"),
                             ("extract_read_checkpoint", "group_name, thread, kind"),
                             ("extract_write_checkpoint", "group_name"), ("open_transaction", "group_name, xid"),
                             ("extract_run", "run_id"), ("trail_file", "trail, seqno"), ("br_checkpoint",
                                                                                           "checkpoint_id")):
            cur.execute(sql.SQL("SELECT * FROM trailbound.{} ORDER BY {}").format(
                sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in order.split(", "))))
            tables[table] = cur.fetchall()
    trail_dir = tmp_path / "dirdat"
    tables["archive files"] = files_on_disk(tmp_path / "archive")
    tables["trail files"] = files_on_disk(trail_dir) if trail_dir.exists() else {}
    return tables


@pytest.mark.spark
@pytest.mark.pg
def test_open_transactions_pin_their_log_with_and_without_br_until_br_persists_them(tmp_path, spark, store, cli_env,
                                                                                    capsys):
    """EXT1 uses Bounded Recovery, EXT2 does not (broff). LONG starts at hour 2:30
    (scn 9000) and commits in hour 8."""
    hourly_archive(tmp_path, total_hours=10, long_from=2, commit_hour=8)
    config_path = write_config(tmp_path, extracts={"EXT1": "", "EXT2": "      broff: true\n"},
                               retention="  minkeephours: 0\n")
    config = configuration.load(config_path)
    assert trailbound(config_path, "register", "extract", "EXT1", "logretention") == 0
    assert trailbound(config_path, "register", "extract", "ext2", "LOGRETENTION") == 0
    assert trailbound(config_path, "register", "extract", "EXT1", "logretention") == 1
    assert "already registered" in capsys.readouterr().err
    long_start = hours(2) + 1800

    run(spark, store, config, "EXT1", 3)
    assert registration(store, "EXT1")["required_scn"] == long_start, "committed with the run's checkpoints"
    assert [t.persisted for t in state(store, "EXT1").open if t.xid == "LONG"] == [None], "younger than 1 BR interval"
    run_retention(store, config)
    assert purged(store) == [], "EXT2 has not run: its first run reads from the archive's oldest segment"

    run(spark, store, config, "EXT2", 3)
    result = run_retention(store, config)
    # Without BR (EXT2) and with BR before persisting (EXT1), LONG's start pins hour 2.
    assert purged(store) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert {(r["purge_scn"], r["purge_run_id"]) for r in catalog_rows(store) if r["state"] == PURGED} == \
        {(long_start, result.sources[0].run_id)}
    assert not (tmp_path / "archive" / "arch_1_000000002.parquet").exists()
    assert not (tmp_path / "archive" / "arch_1_000000002.json").exists()
    assert (tmp_path / "archive" / "arch_1_000000003.parquet").exists()

    run(spark, store, config, "EXT1", 5)  # crosses a BR boundary: LONG (2.5 hours old) is persisted
    [long_one] = [t for t in state(store, "EXT1").open if t.xid == "LONG"]
    assert long_one.persisted is not None
    assert registration(store, "EXT1")["required_scn"] == hours(5), "bounded: from the BR checkpoint"
    assert registration(store, "EXT2")["required_scn"] == long_start
    run_retention(store, config)
    assert purged(store) == [(1, 1), (1, 2), (2, 1), (2, 2)], "two captures: the one further behind holds"
    capsys.readouterr()
    assert trailbound(config_path, "info", "retention") == 0
    shown = capsys.readouterr().out
    for expected in (f"EXTRACT EXT1     enabled, first scn 0, required scn {hours(5)}, read below scn {hours(5)}",
                     f"EXTRACT EXT2     enabled, first scn 0, required scn {long_start}",
                     f"Minimum required SCN: {long_start}", "Purgeable now: 0 segment(s)",
                     f"thread 1 sequence 3, scn {hours(2)}..{hours(3)}: needed by extract EXT2 from scn {long_start}",
                     f"thread 1 sequences 4..5, scn {hours(3)}..{hours(5)}: not read yet by extract EXT2 (read below "
                     f"scn {hours(3)})",
                     f"thread 1 sequences 6..10, scn {hours(5)}..{hours(10)}: not read yet by extract EXT1 (read "
                     f"below scn {hours(5)}); not read yet by extract EXT2"):
        assert expected in shown, expected

    assert trailbound(config_path, "unregister", "extract", "EXT2", "logretention") == 0
    # Were EXT1's BR unusable (here: broff set), its next run would re-read from LONG's start: kept.
    broff = configuration.load(write_config(tmp_path, extracts={"EXT1": "      broff: true\n"},
                                            retention="  minkeephours: 0\n", filename="broff.yaml"))
    before = snapshot(store, tmp_path)
    unusable = run_retention(store, broff, dry_run=True).sources[0].plan
    assert unusable.purged == [] and unusable.required_scn == Scn(long_start)
    [ext1] = [r for r in unusable.registrations if r.group == "EXT1"]
    assert ext1.committed_scn == Scn(hours(5)) and "normal recovery" in ext1.note
    dry = run_retention(store, config, dry_run=True)
    would = [(d.segment.thread, d.segment.sequence) for d in dry.purged]
    assert would == [(1, 3), (1, 4), (1, 5), (2, 3), (2, 4), (2, 5)], "persisted by BR: LONG no longer pins its log"
    assert snapshot(store, tmp_path) == before, "a dry run changes nothing"
    run_retention(store, config)
    assert purged(store) == sorted([(1, 1), (1, 2), (2, 1), (2, 2)] + would)

    run(spark, store, config, "EXT1")  # to the end: LONG commits in hour 8, restored from its BR file
    assert transactions(committed_trail(store, config)) == \
        expected_transactions(total_hours=10, long_from=2, commit_hour=8)
    assert state(store, "EXT1").open == []
    with pytest.raises(ArchiveError, match=f"missing log segment thread 1 sequence 3, needed from scn {long_start} "
                                           f"for extract EXT2; restore it to the archive directory"):
        run(spark, store, config, "EXT2")


@pytest.mark.spark
@pytest.mark.pg
def test_space_limit_purges_a_needed_segment_the_capture_stops_cleanly_and_converges_once_restored(
        tmp_path, spark, store, caplog):
    """No BR: LONG starts at hour 1:30 (scn 5400) and commits in hour 6."""
    hourly_archive(tmp_path, total_hours=8, long_from=1, commit_hour=6)
    archive = tmp_path / "archive"
    config = configuration.load(write_config(tmp_path, extracts={"EXT1": "      broff: true\n"},
                                             retention="  minkeephours: 0\n"))
    register(store, config, "EXT1")
    run(spark, store, config, "EXT1", 3)
    back_up(archive, tmp_path / "backup")
    sizes = {(r.segment.thread, r.segment.sequence): r.segment.bytes for r in ArchiveCatalog(store, "SRC").entries()}
    # After the normal purge (sequence 1 of both threads) everything else stays; one byte
    # less than that forces the oldest out: thread 1 sequence 2, which holds LONG's start.
    limit = sum(size for (t, s), size in sizes.items() if s > 1) - 1
    tight = configuration.load(write_config(tmp_path, extracts={"EXT1": "      broff: true\n"},
                                            retention=f"  minkeephours: 0\n  maxbytes: {limit}\n"))
    with caplog.at_level(logging.WARNING, logger="trailbound.retention"):
        result = run_retention(store, tight)
    outcome = result.sources[0]
    assert [(d.segment.thread, d.segment.sequence, d.forced) for d in outcome.plan.purged] == \
        [(1, 1, False), (1, 2, True), (2, 1, False)]
    warning = "\n".join(r.getMessage() for r in caplog.records)
    assert "WARNING: the following redo segments of source SRC are needed by capture" in warning
    assert f"{archive / 'arch_1_000000002.parquet'}" in warning and "needed by EXT1 (from scn 5400)" in warning
    assert f"restore each segment's data file AND manifest" in warning and str(archive) in warning
    assert warning in outcome.alert and outcome.alert in result.describe()
    row = {(r["thread"], r["sequence"]): r for r in catalog_rows(store)}[(1, 2)]
    assert row["state"] == PURGED and row["purge_scn"] is None and row["purge_reason"].startswith("space:")
    assert "thread 1 sequence 2" in registration(store)["needs_restore"]

    before = snapshot(store, tmp_path)
    with pytest.raises(ArchiveError) as error:
        run(spark, store, config, "EXT1", 5)
    assert str(error.value) == (f"{archive / 'arch_1_000000002.parquet'}: missing log segment thread 1 sequence 2, "
                                f"needed from scn 5400 for extract EXT1; restore it to the archive directory or "
                                f"alter extract EXT1 begin after it")
    assert snapshot(store, tmp_path) == before, "the stopped run wrote nothing"

    restore(tmp_path / "backup", archive, segment_files(1, 2))
    again = run_retention(store, tight).sources[0]
    assert [(s.thread, s.sequence) for s in again.readmitted] == [(1, 2)]
    # Back over the limit by those bytes: the restored segment stays for EXT1, the oldest
    # segment nobody needs (thread 2's empty sequence 2) goes instead.
    assert [(d.segment.thread, d.segment.sequence, d.forced) for d in again.plan.purged] == [(2, 2, True)]
    assert again.alert is None
    row = {(r["thread"], r["sequence"]): r for r in catalog_rows(store)}[(1, 2)]
    assert row["state"] == AVAILABLE and row["restored_at"] is not None

    run(spark, store, config, "EXT1")
    assert transactions(committed_trail(store, config)) == \
        expected_transactions(total_hours=8, long_from=1, commit_hour=6)
    assert registration(store)["needs_restore"] is None


@pytest.mark.spark
@pytest.mark.pg
def test_backup_and_minkeephours_policies_and_a_crash_before_the_commit_is_repaired(tmp_path, spark, store, cli_env,
                                                                                   capsys):
    hourly_archive(tmp_path, total_hours=6, long_from=99)
    config_path = write_config(tmp_path, retention="  minkeephours: 2\n  backedup: 1\n")
    config = configuration.load(config_path)
    assert trailbound(config_path, "register", "extract", "EXT1", "logretention") == 0
    run(spark, store, config, "EXT1")
    assert registration(store)["required_scn"] == hours(6), "nothing open: the read position"
    back_up(tmp_path / "archive", tmp_path / "backup")

    assert trailbound(config_path, "retention", "run") == 0
    assert "purged 0 segment(s)" in capsys.readouterr().out and purged(store) == []
    assert trailbound(config_path, "archive", "mark-backed-up", "--thread", "1", "--through-sequence", "2") == 0
    assert "2 available segment(s) marked" in capsys.readouterr().out
    assert trailbound(config_path, "retention", "run") == 0
    assert purged(store) == [(1, 1), (1, 2)]
    out = capsys.readouterr().out
    assert "thread 2 sequences 1..4, scn 0..14400: backed up 0 of 1 time(s) (backedup)" in out
    assert ("thread 1 sequences 5..6, scn 14400..21600: backed up 0 of 1 time(s) (backedup); within the newest 2 "
            "hour(s) of log (minkeephours)") in out
    assert trailbound(config_path, "archive", "mark-backed-up") == 0
    assert "10 available segment(s) marked" in capsys.readouterr().out

    # Killed after deleting files, before the commit: the rows stay available, files gone.
    env = {**os.environ, CRASH_ENV: "retention_after_delete", "TRAILBOUND_METADATA_DSN": store.connection.dsn}
    crashed = subprocess.run([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "retention",
                              "run"], env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    assert purged(store) == [(1, 1), (1, 2)]
    assert not (tmp_path / "archive" / "arch_2_000000001.parquet").exists()
    assert not (tmp_path / "archive" / "arch_2_000000001.json").exists()
    with store.transaction() as cur:
        cur.execute("SELECT count(*) AS n FROM trailbound.retention_run")
        assert cur.fetchone()["n"] == 2
    result = run_retention(store, config)
    assert purged(store) == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (2, 3), (2, 4)]
    assert all(d.gone for d in result.purged), "repaired: the crashed run had deleted them"
    assert "(already gone from disk: 3, 4)" in result.describe()

    capsys.readouterr()
    assert trailbound(config_path, "archive", "list", "--thread", "2") == 0
    listing = capsys.readouterr().out
    assert "purged" in listing and "below required scn 21600" in listing and "its file was already gone" in listing
    assert "available backed-up x1" in listing

    # A restore that is not the same file is refused, naming it; nothing changes.
    catalog = ArchiveCatalog(store, "SRC")
    (tmp_path / "archive" / "arch_2_000000001.parquet").write_bytes(b"")
    (tmp_path / "archive" / "arch_2_000000001.json").write_text(json.dumps(_manifest_of(store, 2, 1)))
    with pytest.raises(ArchiveError, match="arch_2_000000001.parquet: size is 0 bytes"):
        catalog.scan(tmp_path / "archive", spark)
    with pytest.raises(ArchiveError, match="arch_2_000000001.parquet: size is 0 bytes"):
        run_retention(store, config)
    assert (2, 1) in purged(store)
    # The real files: the scan every capture run starts with makes the segment available.
    restore(tmp_path / "backup", tmp_path / "archive", segment_files(2, 1))
    scanned = catalog.scan(tmp_path / "archive", spark)
    assert [(s.thread, s.sequence) for s in scanned.restored] == [(2, 1)]
    assert "thread 2 sequence 1 restored, available again" in scanned.describe()
    assert (2, 1) not in purged(store)
    run_retention(store, config)
    assert (2, 1) in purged(store), "no capture needs it: it goes again"


def _manifest_of(store, thread_: int, sequence: int) -> dict:
    """The manifest a segment was cataloged with, as the writer wrote it."""
    [e] = [e for e in ArchiveCatalog(store, "SRC").entries()
           if (e.segment.thread, e.segment.sequence) == (thread_, sequence)]
    s = e.segment
    return {"thread": s.thread, "sequence": s.sequence, "first_scn": s.first_scn.value, "next_scn": s.next_scn.value,
            "first_time": s.first_time.isoformat(), "next_time": s.next_time.isoformat(), "records": s.records,
            "bytes": s.bytes, "sha256": s.sha256, "format": s.format}


def test_a_deleted_extract_keeps_its_log_until_unregistered_and_says_so(tmp_path, spark, store, cli_env, capsys):
    # Delete then add again (the lost-trail runbook) must not open a window for a purge.
    hourly_archive(tmp_path, total_hours=3, long_from=99)
    config_path = write_config(tmp_path, retention="  minkeephours: 0\n")
    ArchiveCatalog(store, "SRC").scan(configuration.load(config_path).archive_dir("SRC"), spark)
    assert trailbound(config_path, "add", "extract", "EXT1", "--begin", "scn", str(hours(1))) == 0
    assert trailbound(config_path, "register", "extract", "EXT1", "logretention") == 0
    assert trailbound(config_path, "delete", "extract", "EXT1") == 0
    assert ("EXTRACT EXT1 is still registered with logretention: retention keeps every segment of source SRC until "
            "it is added again and runs, or until `trailbound unregister extract EXT1 logretention`"
            ) in capsys.readouterr().out
    assert trailbound(config_path, "info", "retention") == 0
    assert "no extract group of this name is added: it holds the log until unregistered" in capsys.readouterr().out
    assert trailbound(config_path, "retention", "run") == 0
    assert purged(store) == [], "nothing goes while the deleted group may come back"

    assert trailbound(config_path, "add", "extract", "EXT1", "--begin", "scn", str(hours(1))) == 0
    assert trailbound(config_path, "unregister", "extract", "EXT1", "logretention") == 0
    assert trailbound(config_path, "delete", "extract", "EXT1") == 0
    assert "still registered" not in capsys.readouterr().out
