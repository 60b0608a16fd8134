"""The heartbeat (docs/heartbeat.md) from the simulator's archive to the target, in
process: capture on local Spark with a TABLE selection that does not name the heartbeat
table, a pump whose TABLE filter does not name it either, replicat whose MAP (the
identity) would select it. Every heartbeat the simulator wrote reaches the target's
heartbeat tables with its five stamps, in order; each hop's lag is the difference of
two stamps and they add up to the end-to-end lag; the stamps are the stages' own commit
times; the metadata store's copy holds the same (a copy missing the last beats gets them at the
next run's start); `lag`, INFO ALL, the metrics and the
console's JSON say it; the user tables still equal the truth."""

from __future__ import annotations

import re
from datetime import timedelta

import psycopg2
import psycopg2.extras
import pytest

from pg_source_kit import source_dsn, source_server  # noqa: F401 (fixtures)
from replicat_kit import differences, write_config
from trailbound import cli
from trailbound import config as configuration
from trailbound import heartbeat, metrics
from trailbound.archive.segments import load_defs
from trailbound.capture.run import run_extract
from trailbound.pump.run import run_pump
from trailbound.replicat import target as tgt
from trailbound.replicat.run import run_replicat
from trailbound.sources.simulator import simulate

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def _rows(dsn: str, query: str) -> list[dict]:
    with psycopg2.connect(dsn) as connection, connection.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute(query)
        rows = [dict(r) for r in cur.fetchall()]
    connection.close()
    return rows


def _cli(capsys, config_path, *words) -> str:
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), *words]) == 0
    return capsys.readouterr().out


@pytest.mark.long_running(120)
def test_simulated_heartbeats_reach_the_target_with_every_stamp(tmp_path, spark, store, metadata_dsn, target_dsn,
                                                                monkeypatch, capsys):
    summary = simulate(tmp_path / "archive", tmp_path / "truth.json", records=1500, hours=2, seed=3, threads=2,
                       segment_minutes=30, heartbeat_seconds=120, heartbeat_source="SRC")
    sent = summary.features["heartbeats"]
    assert sent >= 50   # one every 2 minutes of log time
    config_path = write_config(tmp_path, tables=("shop.*",), maps=[("shop.*", "shop.*"), ("*.*", "*.*")])
    text = config_path.read_text().replace("replicats:\n  REP1:\n    exttrail: dirdat/lt",
                                           "replicats:\n  REP1:\n    exttrail: remote/rt")
    config_path.write_text(text + "pumps:\n  PMP1: {exttrail: dirdat/lt, rmttrail: remote/rt, table: [\"shop.*\"]}\n")
    config = configuration.load(config_path)
    defs = load_defs(config.archive_dir("SRC"))
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        created = tgt.create_tables(cur, defs, config.replicat("REP1").map)
    connection.close()
    assert "trailbound.trailbound_heartbeat" not in {source for source, _, _ in created}

    run_extract(spark, store, config, "EXT1")
    run_pump(None, store, config, "PMP1")
    applied = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert applied.transactions > sent

    # the heartbeat table is never a user table on the target, whatever the MAP
    assert _rows(target_dsn, "SELECT to_regclass('trailbound.trailbound_heartbeat') AS t") == [{"t": None}]
    shop = {name: table for name, table in _truth(tmp_path).items() if name.startswith("shop.")}
    assert differences(target_dsn, {"tables": shop}) == {}

    latest = _rows(target_dsn, "SELECT * FROM trailbound.heartbeat")
    history = _rows(target_dsn, "SELECT * FROM trailbound.heartbeat_history ORDER BY seq")
    assert [(r["group_name"], r["source"], r["seq"]) for r in latest] == [("REP1", "SRC", sent)]
    assert [r["seq"] for r in history] == list(range(1, sent + 1))
    local = {r["seqno"]: r["created_at"] for r in _rows(metadata_dsn, "SELECT seqno, created_at FROM "
                                                        "trailbound.trail_file WHERE trail LIKE '%/dirdat/lt'")}
    remote = {r["seqno"]: r["created_at"] for r in _rows(metadata_dsn, "SELECT seqno, created_at FROM "
                                                         "trailbound.trail_file WHERE trail LIKE '%/remote/rt'")}
    for row in history:
        stamps = [row[name] for name in heartbeat.STAMPS]
        assert None not in stamps, row
        assert stamps == sorted(stamps), row                      # written <= archived <= captured <= pumped <= applied
        assert row["archived_at"] - row["written_at"] <= timedelta(minutes=30)  # its segment's close
        assert row["captured_at"] in local.values() and row["pumped_at"] in remote.values()
    assert latest[0] == history[-1]

    # gg_lag's view: each hop between two stamps, the hops adding up to the end-to-end lag
    (view,) = _rows(target_dsn, "SELECT * FROM trailbound.heartbeat_lag")
    last = history[-1]
    assert float(view["incoming_lag"]) == pytest.approx((last["applied_at"] - last["written_at"]).total_seconds())
    assert float(view["capture_lag"]) == pytest.approx((last["captured_at"] - last["archived_at"]).total_seconds())
    assert sum(float(view[f"{hop}_lag"]) for hop in heartbeat.HOPS) == pytest.approx(float(view["incoming_lag"]))

    # the metadata store's copy is the target's; one that lost its last beats (a run
    # killed between a target commit and its file checkpoint) gets them at the next start
    assert _rows(metadata_dsn, "SELECT * FROM trailbound.heartbeat_history ORDER BY seq") == history
    assert _rows(metadata_dsn, "SELECT * FROM trailbound.heartbeat") == latest
    with store.transaction() as cur:
        cur.execute("DELETE FROM trailbound.heartbeat_history WHERE seq > %s", (sent - 3,))
        cur.execute("DELETE FROM trailbound.heartbeat")
    assert run_replicat(spark, store, config, "REP1", target_dsn=target_dsn).note == "nothing new in the trail"
    assert _rows(metadata_dsn, "SELECT * FROM trailbound.heartbeat_history ORDER BY seq") == history
    assert _rows(metadata_dsn, "SELECT * FROM trailbound.heartbeat") == latest

    # what a user reads
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", metadata_dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    total = (last["applied_at"] - last["written_at"]).total_seconds()
    lag = _cli(capsys, config_path, "lag", "replicat", "REP1")
    assert f"Heartbeat from SRC (seq {sent}" in lag and f"end-to-end lag {total:.1f} s" in lag
    for hop in heartbeat.HOPS:
        assert re.search(rf"\b{hop} -?[\d.]+ s\b", lag), lag
    over_time = _cli(capsys, config_path, "lag")
    assert over_time.count("\n  20") == min(sent, 10)              # the last ten heartbeats, one line each
    assert f"REPLICAT REP1  Heartbeat from SRC (seq {sent}" in _cli(capsys, config_path, "info", "all")
    text = metrics.render(store, config)
    assert f'trailbound_heartbeat_lag_seconds{{group="REP1",source="SRC",hop="total"}} {round(total, 6)!r}' in text
    with store.transaction() as cur:
        data = heartbeat.snapshot(cur, last["applied_at"])
    assert [b["seq"] for b in data["history"]["REP1/SRC"]] == list(range(1, sent + 1))
    assert data["latest"][0]["lag_seconds"]["total"] == pytest.approx(total)


def _truth(tmp_path) -> dict:
    import json

    return json.loads((tmp_path / "truth.json").read_text())["tables"]


def test_a_heartbeat_table_is_always_captured_and_pumped_and_never_mapped():
    """Whatever TABLE and MAP say: capture and pump keep it, replicat maps it nowhere."""
    from trailbound.config import MapRule

    chosen = heartbeat.selection(["shop.*"])
    assert chosen.fullmatch("trailbound.trailbound_heartbeat") and chosen.fullmatch("ops.trailbound_heartbeat")
    assert not chosen.fullmatch("hr.employees") and not chosen.fullmatch("hr.trailbound_heartbeats")
    assert not heartbeat.is_heartbeat("a.b.trailbound_heartbeat") and not heartbeat.is_heartbeat("trailbound_heartbeat")
    assert tgt.map_name(tgt.IDENTITY, "trailbound.trailbound_heartbeat") is None
    assert tgt.map_name([MapRule(source="trailbound.*", target="copy.*")], "trailbound.trailbound_heartbeat") is None
    assert tgt.map_name(tgt.IDENTITY, "hr.employees") == ("hr", "employees")



def test_the_console_serves_each_replicats_heartbeats_as_json(tmp_path, store, metadata_dsn, monkeypatch):
    """/trailbound/api/heartbeat (the console's data, trailbound.heartbeat.snapshot): the
    last beat per replicat and source with its lag per hop and end to end, and the
    history oldest first; a beat recorded twice is one row."""
    from datetime import UTC, datetime

    from fastapi.testclient import TestClient

    from trailbound_airflow import console

    t0 = datetime(2026, 11, 27, 8, 0, tzinfo=UTC)

    def beat(seq: int, start: datetime, pumped: bool = True) -> heartbeat.Beat:
        seconds = lambda n: start + timedelta(seconds=n)  # noqa: E731
        return heartbeat.Beat("REP1", "PG", seq, start, seconds(1), seconds(3), seconds(4) if pumped else None,
                              seconds(6), f"{seq}@1:1:1")

    with store.transaction() as cur:
        heartbeat.record(cur, [beat(6, t0), beat(7, t0 + timedelta(minutes=1))])
        heartbeat.record(cur, [beat(6, t0)])    # again: nothing changes
    monkeypatch.setenv("TRAILBOUND_CONFIG", str(write_config(tmp_path)))
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", metadata_dsn)
    app = console.create_app()
    app.dependency_overrides[console.authorized_user] = lambda: "viewer"
    body = TestClient(app).get("/api/heartbeat").json()
    assert body["hops"] == ["archive", "capture", "pump", "replicat"]
    [latest] = body["latest"]
    assert (latest["group"], latest["source"], latest["seq"]) == ("REP1", "PG", 7)
    assert latest["lag_seconds"] == {"archive": 1.0, "capture": 2.0, "pump": 1.0, "replicat": 2.0, "total": 6.0}
    assert latest["applied_at"] == "2026-11-27T08:01:06+00:00" and latest["age_seconds"] > 0
    assert [b["seq"] for b in body["history"]["REP1/PG"]] == [6, 7]
    # without a pump, replicat's hop starts at capture's stamp
    assert beat(8, t0, pumped=False).lags() == {"archive": 1.0, "capture": 2.0, "pump": None, "replicat": 3.0,
                                              "total": 6.0}


class _Chunk:
    """A chunk's records as replicat's prepare thread hands them to the heartbeats."""

    def __init__(self, rows: list[dict]):
        import pyarrow as pa

        self.light = self.records = pa.Table.from_pylist(rows)

    def path_of(self, seqno: int) -> str:
        return f"/trail/rt{seqno:09d}"


def test_a_heartbeat_row_that_is_not_one_stops_replicat_naming_file_and_rba():
    from trailbound.errors import TrailError
    from trailbound.replicat.heartbeat import Heartbeats

    def record(rba: int, table: str, after: str | None) -> dict:
        return {"seqno": 3, "rba": rba, "table": table, "op": "UPDATE", "after": after, "csn": 100 + rba,
                "csn_thread": 1, "csn_sequence": 1, "csn_rba": rba}

    good = '{"source": "PG", "seq": 4, "written_at": "2026-11-27 08:00:00+00", "archived_at": "2026-11-27 08:00:01+00"}'
    beats = Heartbeats("REP1", "/trail/rt", "trailbound")
    beats.take(_Chunk([record(0, "shop.orders", '{"id": 1}'), record(1, "trailbound.trailbound_heartbeat", good)]))
    [pending] = beats._pending
    assert (pending.position.seqno, pending.position.rba, pending.beat.seq) == (3, 1, 4)
    for bad in ('{"source": "PG", "seq": "x", "written_at": "2026-11-27 08:00:00+00"}',
                '{"source": "PG", "seq": 5, "written_at": null}', '{"seq": 5, "written_at": "2026-11-27"}',
                '{"source": "PG", "seq": 5, "written_at": "yesterday"}', "not json"):
        with pytest.raises(TrailError) as refused:
            beats.take(_Chunk([record(7, "ops.trailbound_heartbeat", bad)]))
        assert str(refused.value).startswith("/trail/rt000000003 rba 7: a ops.trailbound_heartbeat row is not a "
                                             "heartbeat"), refused.value
    assert len(beats._pending) == 1, "nothing taken from a refused chunk"

# ---------------------------------------------------------------- a live PostgreSQL source

@pytest.mark.long_running(90)
def test_a_live_source_beats_every_pull_and_the_target_reads_its_lag(source_dsn, target_dsn, store, metadata_dsn,
                                                                     spark, tmp_path, monkeypatch, capsys):
    """Published tables idle, an unpublished one written heavily: each pull still
    archives a change (the heartbeat) and the slot's confirmed position passes the busy
    WAL; the heartbeats reach the target through capture, pump and replicat, and the
    end-to-end lag is the target's applied time minus the source's write time."""
    from pg_source_kit import SOURCE_ENV, execute, query, slot_confirmed
    from pg_source_kit import write_config as live_config
    from trailbound.archive.segments import discover
    from trailbound.sources.postgres.admin import pull
    import pyarrow.parquet as pq

    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", metadata_dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    execute(source_dsn, "CREATE TABLE public.pgbench_branches (bid int PRIMARY KEY, bbalance int)",
            "INSERT INTO public.pgbench_branches VALUES (1, 0)",
            "CREATE TABLE public.busy (id bigserial PRIMARY KEY, v text)")
    config_path = live_config(tmp_path, tables=("public.pgbench_*",))
    config = configuration.load(config_path)
    _cli(capsys, config_path, "add", "source", "PG")
    assert "trailbound.trailbound_heartbeat ready" in _cli(capsys, config_path, "add", "heartbeattable", "PG")

    first = pull(config, "PG", patience=10)
    assert first.published == ["trailbound.trailbound_heartbeat"]   # with its row, then the pull's beat
    for _ in range(2):
        execute(source_dsn, "INSERT INTO public.busy (v) SELECT repeat('x', 200) FROM generate_series(1, 20000)")
        (busy_end,), = query(source_dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        result = pull(config, "PG", patience=10)
        assert (result.changes, result.commits) == (1, 1), result.describe()
        assert slot_confirmed(source_dsn) > busy_end
    archive = config.archive_dir("PG")
    beats = [r for s in discover(archive) for r in pq.read_table(s.path).to_pylist()
             if r["table"] == "trailbound.trailbound_heartbeat"]
    assert [(r["op"], heartbeat.Beat.from_image("", r["after"], "").seq) for r in beats] == \
        [("INSERT", 1), ("UPDATE", 2), ("UPDATE", 3), ("UPDATE", 4)]
    for r in beats:
        beat = heartbeat.Beat.from_image("", r["after"], "")
        assert beat.source == "PG" and timedelta(0) <= beat.archived_at - beat.written_at < timedelta(minutes=5)

    _cli(capsys, config_path, "target", "create")
    run_extract(spark, store, config, "EXT1")
    run_pump(None, store, config, "PMP1")
    run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    history = _rows(target_dsn, "SELECT * FROM trailbound.heartbeat_history ORDER BY seq")
    assert [(r["group_name"], r["source"], r["seq"]) for r in history] == [("REP1", "PG", n) for n in (1, 2, 3, 4)]
    for row in history:
        stamps = [row[name] for name in heartbeat.STAMPS]
        assert None not in stamps and stamps == sorted(stamps), row
    (view,) = _rows(target_dsn, "SELECT * FROM trailbound.heartbeat_lag")
    last = history[-1]
    assert float(view["incoming_lag"]) == pytest.approx((last["applied_at"] - last["written_at"]).total_seconds())
    assert 0 < float(view["incoming_lag"]) < 900
    assert "Heartbeat from PG (seq 4" in _cli(capsys, config_path, "lag", "replicat", "REP1")

    # DELETE HEARTBEATTABLE: gone from the source and its publication; pulls stop beating
    assert "heartbeat table trailbound.trailbound_heartbeat dropped" in _cli(
        capsys, config_path, "delete", "heartbeattable", "PG")
    assert query(source_dsn, "SELECT to_regclass('trailbound.trailbound_heartbeat')") == [(None,)]
    after = pull(config, "PG", patience=10)
    assert (after.changes, after.commits, after.published) == (0, 0, []), after.describe()
    assert cli.main(["--config", str(config_path), "delete", "heartbeattable", "PG"]) == 1
    assert "no heartbeat table trailbound.trailbound_heartbeat on source PG" in capsys.readouterr().err
