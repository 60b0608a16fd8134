"""REPERROR and discards (replicat/reperror.py, replicat/discards.py, replicat/reapply.py):
a real target with CHECK and unique constraints the source does not have, so that some
operations are refused, and what each rule makes of them.

- discard: the replica is the source except the discarded operations, each in the
  discard table with its trail position, CSN, xid, table, op, images, SQLSTATE and
  message, and in the run's discard file; STATS counts them, INFO REPLICAT and compare
  report them; `trailbound discards` lists them and --reapply converges once the target
  is fixed (reporting what it still refuses).
- a kill with the discard row written but not committed, then one after the commit but
  before the file: the rerun neither loses nor duplicates a discard, and the file gets it.
- transdiscard sets the whole source transaction aside; ignore (for a MAP) skips; the
  default abend stops at the record no rule covers (a missing row, SQLSTATE 02000) until
  a rule for it is added.
- retryop: a transient error (a trigger raising SQLSTATE 40001 while told to) is tried
  again; once the retries are spent the run stops saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest
import yaml

from capture_kit import rec
from replicat_kit import captured, checkpoint_row, orders
from trailbound import cli, quality
from trailbound import config as configuration
from trailbound.compare.run import outstanding_discards
from trailbound.config import RepErrorRule
from trailbound.crash import CRASH_ENV
from trailbound.errors import ConfigError, TrailboundError
from trailbound.positions import Csn
from trailbound.replicat.info import describe_replicat
from trailbound.replicat.reperror import Policy
from trailbound.replicat.run import run_replicat
from trailbound.trail import format as trail

pytestmark = [pytest.mark.spark, pytest.mark.pg]


def _ins(scn: int, xid: str, key: int, note: str | None = None) -> dict:
    return rec(scn, xid, "INSERT", "shop.orders", key=key, note=note)


def _commit(scn: int, xid: str) -> dict:
    return rec(scn, xid, "COMMIT")


def _rules(config_path, rules: list[dict], **options) -> configuration.Config:
    document = yaml.safe_load(config_path.read_text())
    document["replicats"]["REP1"].update({"reperror": rules, **options})
    config_path.write_text(yaml.safe_dump(document))
    return configuration.load(config_path)


def _target(target_dsn: str, *statements: str) -> None:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    connection.close()


def _discards(target_dsn: str) -> list[dict]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT * FROM trailbound.discards ORDER BY discard_id")
        rows = [dict(zip([d.name for d in cur.description], row)) for row in cur.fetchall()]
    connection.close()
    return rows


def _trail_records(config) -> dict[tuple[int, int], dict]:
    """The committed trail's records by (seqno, rba)."""
    found = {}
    for path in trail.existing_files(Path(config.trail_location(config.replicat("REP1").exttrail))):
        seqno = int(path.name[-9:])
        for record in trail.read_file(path).to_pylist():
            found[(seqno, record["rba"])] = record
    return found


def _counts(store) -> dict:
    with store.transaction() as cur:
        cur.execute("SELECT table_name, sum(inserts) AS i, sum(updates) AS u, sum(discards) AS d FROM"
                    " trailbound.run_table_counts WHERE stage = 'replicat' GROUP BY table_name")
        return {r["table_name"]: (r["i"], r["u"], r["d"]) for r in cur.fetchall()}


# T1 inserts a note the target refuses, T2 a key it refuses, T3 updates a row T1 applied.
REFUSED = [_ins(10, "T1", 1), _ins(11, "T1", 2, "bad"), _ins(12, "T1", 3), _commit(13, "T1"),
           _ins(20, "T2", 5), _commit(21, "T2"),
           rec(30, "T3", "UPDATE", "shop.orders", key=1, note="changed"), _commit(31, "T3")]
SOURCE = {1: "changed", 2: "bad", 3: "n3", 5: "n5"}
CONSTRAINTS = ("ALTER TABLE shop.orders ADD CONSTRAINT note_ok CHECK (note IS DISTINCT FROM 'bad')",
               "ALTER TABLE shop.orders ADD CONSTRAINT id_ok CHECK (id <> 5)")


@pytest.mark.long_running(60)
def test_discarded_operations_are_recorded_counted_reported_and_reapplied_once_the_target_is_fixed(
        tmp_path, spark, store, target_dsn, capsys, monkeypatch):
    config_path, _ = captured(tmp_path, spark, store, target_dsn, REFUSED)
    config = _rules(config_path, [{"sqlstate": "23514", "action": "discard"}])
    _target(target_dsn, *CONSTRAINTS)

    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.discarded == 2 and "2 operation(s) discarded (REPERROR" in result.describe(), result.describe()
    assert orders(target_dsn) == {1: "changed", 3: "n3"}, "everything but the two refused inserts"
    trail_records = _trail_records(config)
    last = max(trail_records.values(), key=lambda r: r["rba"])
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(last)), "the run went on to the trail's end"

    rows = _discards(target_dsn)
    assert [(r["xid"], r["op"], r["source_table"], r["target_table"], r["action"], r["sqlstate"]) for r in rows] == \
        [("T1", "INSERT", "shop.orders", "shop.orders", "discard", "23514"),
         ("T2", "INSERT", "shop.orders", "shop.orders", "discard", "23514")]
    assert "note_ok" in rows[0]["message"] and "id_ok" in rows[1]["message"]
    for row, key in zip(rows, (2, 5)):
        record = trail_records[(row["seqno"], row["rba"])]   # the position names the record discarded
        assert json.loads(record["after"]) == json.loads(row["after_image"]) == \
            {"id": key, "note": "bad" if key == 2 else "n5"}
        assert row["before_image"] is None and row["csn"] == str(Csn.from_row(record))
        assert row["trail_file"].endswith(f"lt{row['seqno']:09d}") and row["commit_ts"] == record["commit_ts"]
        assert row["in_file"] == str(result.discard_file)

    text = result.discard_file.read_text()
    assert text.count("\nDiscard ") == 2 and "SQLSTATE 23514" in text and "xid 'T2'" in text
    assert '"note": "bad"' in text and f"seqno {rows[0]['seqno']} rba {rows[0]['rba']}" in text
    assert _counts(store) == {"shop.orders": (2, 1, 2)}, "STATS: 4 inserts in the trail, 2 applied, 2 discarded"
    assert "Discards             2 outstanding in trailbound.discards (shop.orders: 2;" in \
        describe_replicat(store, config, "REP1", target_dsn=target_dsn)
    check = quality.validate_replica(config, store, "REP1", target_dsn=target_dsn)   # the replicat DAG's check
    assert not check.success and "shop.orders (2 discarded operation(s) outstanding" in check.describe()

    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    capsys.readouterr()
    assert main("discards", "REP1", "--table", "shop.*") == 0
    out = capsys.readouterr().out
    assert out.count("Discard ") == 2 and "2 discarded operation(s) of replicat REP1 outstanding" in out
    assert main("discards", "REP1", "--since", "2999-01-01") == 0
    assert "0 discarded operation(s)" in capsys.readouterr().out

    # The note constraint goes; the key constraint stays: one reapplied, one still refused.
    _target(target_dsn, "ALTER TABLE shop.orders DROP CONSTRAINT note_ok")
    assert main("discards", "REP1", "--reapply") == 1
    out = capsys.readouterr().out
    assert "reapplied 1 of 2 discarded operation(s)" in out and "SQLSTATE 23514" in out and "id_ok" in out, out
    assert orders(target_dsn) == {1: "changed", 2: "bad", 3: "n3"}
    connection = psycopg2.connect(target_dsn)
    assert outstanding_discards(config, "REP1", connection, {"shop.orders"}) == {"shop.orders": 1}
    _target(target_dsn, "ALTER TABLE shop.orders DROP CONSTRAINT id_ok")
    assert main("discards", "REP1", "--reapply") == 0
    assert "reapplied 1 of 1" in capsys.readouterr().out
    assert orders(target_dsn) == SOURCE and _discards(target_dsn) == []
    assert outstanding_discards(config, "REP1", connection, {"shop.orders"}) == {}
    connection.close()
    assert "Discards " not in describe_replicat(store, config, "REP1", target_dsn=target_dsn)
    assert quality.validate_replica(config, store, "REP1", target_dsn=target_dsn).success


@pytest.mark.long_running(60)
def test_a_kill_before_or_after_a_discard_commits_neither_loses_nor_duplicates_it(tmp_path, spark, store,
                                                                                   target_dsn):
    config_path, _ = captured(tmp_path, spark, store, target_dsn, REFUSED)
    config = _rules(config_path, [{"sqlstate": "23514", "action": "discard"}], apply_parallelism=1)
    _target(target_dsn, CONSTRAINTS[0])
    env = {**os.environ, "TRAILBOUND_METADATA_DSN": store.connection.dsn, "TRAILBOUND_TARGET_DSN": target_dsn}
    replicat = [sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "replicat", "run", "REP1"]
    dsc_dir = config.path(config.replicat("REP1").discarddir)

    killed = subprocess.run(replicat, env={**env, CRASH_ENV: "discard_before_commit"}, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert _discards(target_dsn) == [] and checkpoint_row(target_dsn) is None and orders(target_dsn) == {}

    killed = subprocess.run(replicat, env={**env, CRASH_ENV: "discard_after_commit"}, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == 137, killed.stderr[-3000:]
    rows = _discards(target_dsn)
    assert [(r["xid"], r["in_file"]) for r in rows] == [("T1", None)], "committed, not yet in a file"
    assert orders(target_dsn) == {1: "n1", 3: "n3"} and not list(dsc_dir.glob("*.dsc"))

    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.discarded == 0, "T1 was skipped: its discard committed with its checkpoint row"
    rows = _discards(target_dsn)
    assert [(r["xid"], r["in_file"]) for r in rows] == [("T1", str(result.discard_file))], "one row, now filed"
    assert "xid 'T1'" in result.discard_file.read_text()
    assert orders(target_dsn) == {k: v for k, v in SOURCE.items() if k != 2}


def test_transdiscard_sets_the_whole_transaction_aside_ignore_skips_and_a_missing_row_abends_until_a_rule_covers_it(
        tmp_path, spark, store, target_dsn):
    records = [_ins(10, "T1", 1), _ins(11, "T1", 2, "bad"), _ins(12, "T1", 3), _commit(13, "T1"),
               _ins(20, "T2", 4), _ins(21, "T2", 5), _commit(22, "T2"),
               rec(30, "T3", "UPDATE", "shop.orders", key=1, note="changed"), _commit(31, "T3"),
               _ins(40, "T4", 6), _commit(41, "T4")]
    # One transaction per group: the insert-only ones go to parallel lanes, whose refused
    # groups are replayed on the run's own session, where the rules act.
    config_path, _ = captured(tmp_path, spark, store, target_dsn, records, grouptransops=1)
    rules = [{"sqlstate": "23514", "action": "transdiscard"},
             {"sqlstate": "23505", "action": "ignore", "map": "shop.*"},   # a MAP rule: wins over the code's class
             {"sqlstate": "23", "action": "abend"},
             {"default": "abend"}]
    config = _rules(config_path, rules)
    _target(target_dsn, CONSTRAINTS[0], "INSERT INTO shop.orders VALUES (4, 'the target''s own')")

    with pytest.raises(TrailboundError) as stopped:
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert "xid 'T3': UPDATE on shop.orders key {\"id\": 1}: no row with this key" in str(stopped.value)
    assert orders(target_dsn) == {4: "the target's own", 5: "n5"}, "T1 set aside whole, T2's duplicate ignored"
    rows = _discards(target_dsn)
    assert [(r["xid"], r["action"], json.loads(r["after_image"])["id"]) for r in rows] == \
        [("T1", "transdiscard", 1), ("T1", "transdiscard", 2), ("T1", "transdiscard", 3)]
    assert "note_ok" in rows[1]["message"] and rows[0]["message"].startswith("discarded with its transaction: INSERT")
    assert {r["sqlstate"] for r in rows} == {"23514"}

    config = _rules(config_path, [{"sqlstate": "02000", "action": "discard"}, *rules])
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (result.transactions, result.discarded, result.parallel_groups) == (2, 1, 1), result.describe()
    assert orders(target_dsn) == {4: "the target's own", 5: "n5", 6: "n6"}
    missing = _discards(target_dsn)[-1]
    assert (missing["xid"], missing["op"], missing["sqlstate"], missing["action"]) == ("T3", "UPDATE", "02000",
                                                                                      "discard")
    assert json.loads(missing["before_image"]) == {"id": 1}


def test_retryop_tries_a_transient_error_again_and_stops_once_its_retries_are_spent(tmp_path, spark, store,
                                                                                    target_dsn):
    config_path, _ = captured(tmp_path, spark, store, target_dsn,
                              [_ins(10, "T1", 1), _ins(11, "T1", 2), _commit(12, "T1")])
    config = _rules(config_path, [{"sqlstate": "40001", "action": "retryop", "retries": 2, "delay": "0.1s"}],
                    apply_parallelism=1)
    # Every insert attempt takes a number (a sequence is not rolled back); the trigger
    # refuses the attempts numbered up to `fail_through` with a serialization failure.
    _target(target_dsn, "CREATE SEQUENCE shop.attempts", "CREATE TABLE shop.fail (fail_through bigint)",
            "INSERT INTO shop.fail VALUES (1000000)",
            """CREATE FUNCTION shop.transient() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                 IF nextval('shop.attempts') <= (SELECT fail_through FROM shop.fail) THEN
                   RAISE EXCEPTION 'try again' USING ERRCODE = '40001';
                 END IF;
                 RETURN NEW;
               END $$""",
            "CREATE TRIGGER transient BEFORE INSERT ON shop.orders FOR EACH ROW EXECUTE FUNCTION shop.transient()")

    with pytest.raises(TrailboundError) as stopped:
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert "still refused after 2 retries (REPERROR retryop): ERROR: try again" in str(stopped.value)
    assert orders(target_dsn) == {} and _discards(target_dsn) == []

    # The next two attempts fail (the group's fast path, the first record's replay); the
    # first retry gets through.
    _target(target_dsn, "UPDATE shop.fail SET fail_through = (SELECT last_value + 2 FROM shop.attempts)")
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.retried == 1 and "1 operation attempt(s) retried" in result.describe(), result.describe()
    assert orders(target_dsn) == {1: "n1", 2: "n2"} and _discards(target_dsn) == []


# ---------------------------------------------------------------- the rules themselves

class _Refused(Exception):
    def __init__(self, pgcode):
        super().__init__(pgcode)
        self.pgcode = pgcode


@pytest.mark.parametrize("code,table,expected", [
    ("23505", "shop.orders", "ignore"),      # the MAP rule for class 23 wins over the global code
    ("23505", "hr.salaries", "discard"),     # global: the code wins over...
    ("23514", "hr.salaries", "retryop"),     # ... the class
    ("40P01", "hr.salaries", "transdiscard"),   # the default
    (None, "hr.salaries", "abend"),          # no SQLSTATE (a lost session): always abend
])
def test_the_most_specific_rule_wins(code, table, expected):
    policy = Policy([RepErrorRule(sqlstate="23505", action="discard"),
                     RepErrorRule(sqlstate="23", action="ignore", map="shop.*"),
                     RepErrorRule(sqlstate="23", action="retryop", retries=3, delay="1s"),
                     RepErrorRule(default="transdiscard")])
    action = policy.action(_Refused(code), table)
    assert action.name == expected
    if expected == "retryop":
        assert (action.retries, action.delay) == (3, 1.0)


@pytest.mark.parametrize("rule,message", [
    ({"sqlstate": "2350", "action": "discard"}, "is not a SQLSTATE"),
    ({"sqlstate": "23505"}, "names no action"),
    ({"sqlstate": "23505", "action": "discard", "retries": 2}, "`retries: N` goes with action retryop"),
    ({"sqlstate": "40P01", "action": "retryop"}, "`retries: N` goes with action retryop"),
    ({"default": "abend", "sqlstate": "23"}, "{sqlstate: CODE, action: ACTION} or {default: ACTION}"),
    ({"sqlstate": "23", "action": "drop"}, "reperror"),
])
def test_a_bad_reperror_rule_is_refused_naming_the_file(tmp_path, rule, message):
    from replicat_kit import write_config

    path = write_config(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["replicats"]["REP1"]["reperror"] = [rule]
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as refused:
        configuration.load(path)
    assert str(path) in str(refused.value) and message in str(refused.value), str(refused.value)
