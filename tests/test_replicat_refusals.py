"""What replicat refuses before it applies anything: a run or an alter while another run
holds the group (in this metadata store, or on the target from another installation),
and a target whose mapped tables or columns are missing."""

from __future__ import annotations

import psycopg2
import pytest

from replicat_kit import FOUR, FOUR_APPLIED
from replicat_kit import captured as _captured
from replicat_kit import checkpoint_row_if_created as checkpoint_row
from replicat_kit import orders as _orders
from trailbound import cli
from trailbound.replicat.run import hold_target, release_target

pytestmark = [pytest.mark.spark, pytest.mark.pg]


# ---------------------------------------------------------------- the group lock

def test_a_second_replicat_run_and_alter_are_refused_while_a_run_holds_the_group(tmp_path, spark, store, target_dsn,
                                                                                group_held_elsewhere, capsys, monkeypatch):
    config_path, _ = _captured(tmp_path, spark, store, target_dsn, FOUR)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    with group_held_elsewhere("replicat", "REP1"):
        capsys.readouterr()
        assert main("replicat", "run", "REP1") == 1
        assert "replicat REP1 is held by a running" in capsys.readouterr().err
        assert main("alter", "replicat", "REP1", "extseqno", "1", "extrba", "0") == 1
        assert "replicat REP1 is held by a running" in capsys.readouterr().err
        assert checkpoint_row(target_dsn) is None and _orders(target_dsn) == {}
    assert main("replicat", "run", "REP1") == 0
    assert _orders(target_dsn) == FOUR_APPLIED


def test_a_group_applying_to_the_target_from_another_metadata_store_is_refused_there(tmp_path, spark, store,
                                                                                      target_dsn, capsys,
                                                                                      monkeypatch):
    """The group is held on the target too: a second installation (another metadata store,
    so another group lock) pointed at the same target and group is refused, run and alter
    alike, and runs once the other lets go."""
    config_path, _ = _captured(tmp_path, spark, store, target_dsn, FOUR)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    main = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    other = psycopg2.connect(target_dsn)  # the other installation's run, on the target
    hold_target(other, "REP1")
    try:
        capsys.readouterr()
        assert main("replicat", "run", "REP1") == 1
        assert "replicat REP1 is applying to this target from another process" in capsys.readouterr().err
        assert main("alter", "replicat", "REP1", "extseqno", "1", "extrba", "0") == 1
        assert checkpoint_row(target_dsn) is None and _orders(target_dsn) == {}
    finally:
        release_target(other, "REP1")
    assert main("replicat", "run", "REP1") == 0
    assert _orders(target_dsn) == FOUR_APPLIED


# ---------------------------------------------------------------- the target's columns

@pytest.mark.parametrize("damage,message", [
    ("ALTER TABLE shop.orders DROP COLUMN note", "target table shop.orders has no column(s) 'note'"),
    ("DROP TABLE shop.orders", "target table shop.orders (mapped from source table shop.orders) does not exist"),
], ids=["missing_column", "missing_table"])
def test_replicat_checks_the_target_columns_before_it_applies_anything(tmp_path, spark, store, target_dsn, damage,
                                                                       message, capsys, monkeypatch):
    config_path, _ = _captured(tmp_path, spark, store, target_dsn, FOUR)
    # Under the default `ddl: {mode: apply}` too: replicat adds a column only when a source
    # version brings it, never one the target lost without one (a DBA's DROP COLUMN).
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(damage)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), "replicat", "run", "REP1"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert checkpoint_row(target_dsn) is None
