"""Table versions without a server: defs.json with and without versions, each trail record
numbered by its src_scn, which type changes replicat counts as widening."""

from __future__ import annotations

import json

import psycopg2
import pyarrow as pa
import pytest

from trailbound.archive.segments import load_defs, versions_of
from trailbound.archive.writer import write_defs
from trailbound.errors import ArchiveError
from trailbound.replicat.ddl import widens
from trailbound.trail import format as trail

COLUMNS = [{"name": "id", "type": "integer", "nullable": False}]
WIDER = COLUMNS + [{"name": "note", "type": "text", "nullable": True, "default": "x"}]


def test_an_archive_without_versions_reads_as_version_1_and_versions_round_trip(tmp_path):
    write_defs(tmp_path, [{"name": "shop.a", "columns": COLUMNS, "key": ["id"]}])
    (table,) = load_defs(tmp_path).values()
    assert [(v.version, v.scn) for v in table.versions] == [(1, 0)] and table.version_at(10**9).version == 1
    assert "versions" not in table.as_json()
    grown = table.with_version(tuple(load_defs(_with(tmp_path / "b", WIDER))["shop.a"].columns), ("id",), 500)
    write_defs(tmp_path, [grown.as_json()])
    again = load_defs(tmp_path)["shop.a"]
    assert again == grown and again.columns[-1].default == "x"
    assert [again.version_at(scn).version for scn in (0, 499, 500, 10**9)] == [1, 1, 2, 2]
    assert versions_of({"shop.a": again}) == {"shop.a": [(0, 1), (500, 2)]}


def _with(path, columns):
    write_defs(path, [{"name": "shop.a", "columns": columns, "key": ["id"]}])
    return path


def test_versions_out_of_order_or_unlike_the_top_level_are_refused(tmp_path):
    version = {"version": 1, "scn": 0, "columns": COLUMNS, "key": ["id"]}
    write_defs(tmp_path, [{"name": "shop.a", "columns": COLUMNS, "key": ["id"],
                           "versions": [version, {**version, "version": 2, "scn": 0}]}])
    with pytest.raises(ArchiveError, match="increasing scn"):
        load_defs(tmp_path)
    write_defs(tmp_path, [{"name": "shop.a", "columns": WIDER, "key": ["id"], "versions": [version]}])
    with pytest.raises(ArchiveError, match="must be those of its last version"):
        load_defs(tmp_path)


def test_each_record_is_numbered_by_its_src_scn_and_older_ones_lose_their_copy_line():
    records = pa.table({"table": ["shop.a", "shop.a", None, "shop.b", "shop.a"],
                        "src_scn": pa.array([10, 500, 600, 700, 900], pa.int64()),
                        "copy_line": ["1\n", "2\tx\n", None, "7\n", "3\ty\n"]})
    versions = {"shop.a": [(0, 1), (500, 2)], "shop.b": [(650, 1)]}
    numbered = trail.with_table_versions(records, versions)
    assert numbered.column("table_version").to_pylist() == [1, 2, None, 1, 2]
    assert trail.without_stale_lines(numbered, versions).column("copy_line").to_pylist() == \
        [None, "2\tx\n", None, "7\n", "3\ty\n"]


@pytest.mark.parametrize("old, new, wider", [
    ("integer", "bigint", True), ("smallint", "integer", True), ("bigint", "integer", False),
    ("character varying(10)", "character varying(20)", True), ("character varying(10)", "text", True),
    ("character varying(10)", "character varying(5)", False), ("text", "character varying(5)", False),
    ("numeric(8,2)", "numeric(10,2)", True), ("numeric(8,2)", "numeric(8,3)", False),
    ("numeric(8,2)", "numeric", True), ("numeric", "numeric(30,4)", False), ("real", "double precision", True),
    ("integer", "text", False), ("date", "timestamp without time zone", False),
])
def test_what_counts_as_widening(old, new, wider):
    assert widens(old, new) is wider


# ---------------------------------------------------------------- the simulator's schema changes

@pytest.fixture(scope="module")
def changing(tmp_path_factory):
    """A small simulated archive with every kind of schema change (add, widen, create,
    drop: shop.customers gets three versions), read raw."""
    from test_simulator import read_archive

    from trailbound.sources.simulator import simulate

    directory = tmp_path_factory.mktemp("changing")
    summary = simulate(directory / "archive", directory / "truth.json", records=6_000, hours=12, seed=3,
                       schema_changes="all")
    return (summary, read_archive(directory / "archive"), load_defs(directory / "archive"),
            json.loads((directory / "truth.json").read_text("utf-8")))


def test_the_simulator_records_each_schema_change_as_a_version_as_the_live_miner_does(changing):
    summary, archive, defs, _ = changing
    assert summary.features["schema_changes"] == 4
    customers, timesheets, reviews = defs["shop.customers"], defs["hr.timesheets"], defs["shop.reviews"]
    assert [v.names[-1] for v in customers.versions] == ["notes", "loyalty_tier", "loyalty_tier"]
    assert "notes" not in customers.latest.names and customers.latest.columns[-1].default == "standard"
    assert [c.type for c in timesheets.versions[1].columns if c.name == "emp_id"] == ["bigint"]
    assert len(reviews.versions) == 1 and reviews.versions[0].scn > 0  # appeared mid-archive
    assert list(defs)[-1] == "shop.reviews" and len(defs["shop.orders"].versions) == 1
    # Every record's image holds exactly the columns of the version its scn falls in
    # (an UPDATE's images: some of them), so a reader numbering records by scn is right.
    seen = set()
    for record in archive.records:
        if record["op"] not in ("INSERT", "UPDATE", "DELETE"):
            continue
        version = defs[record["table"]].version_at(record["scn"])
        seen.add((record["table"], version.version))
        assert record["table"] != "shop.reviews" or record["scn"] >= version.scn
        for image in (record["before"], record["after"]):
            if image is not None:
                names = set(json.loads(image))
                assert names <= set(version.names), (record, version.version)
                if record["op"] == "INSERT":
                    assert names == set(version.names)
    assert {("shop.customers", 1), ("shop.customers", 2), ("shop.customers", 3), ("hr.timesheets", 2),
            ("shop.reviews", 1)} <= seen


def test_each_alter_writes_two_versions_of_its_table_in_one_transaction(changing):
    _, archive, defs, _ = changing
    from test_simulator import transactions

    changed = {(name, v.scn) for name, table in defs.items() for v in table.versions[1:]}
    both = 0
    for txn in transactions(archive).values():
        versions = {(r["table"], defs[r["table"]].version_at(r["scn"]).version)
                    for r in txn.records if r["op"] == "INSERT"}
        tables = {table for table, _ in versions}
        if any(len([v for t, v in versions if t == table]) > 1 for table in tables):
            assert txn.committed
            both += 1
    assert both == len(changed) == 3


def test_a_replay_under_each_records_version_reaches_the_truth(changing):
    """The truth is the source's final state: an added column's DEFAULT in the rows that
    existed before it (the changing transaction's own older row among them), a dropped
    column gone, the new table there."""
    from replay_kit import apply_change, canonical
    from test_simulator import contract_order, transactions

    _, archive, defs, truth = changing
    keys = {name: list(table.key) for name, table in defs.items()}
    state: dict[str, dict] = {name: {} for name in defs}
    committed = sorted((t for t in transactions(archive).values() if t.committed), key=lambda t: contract_order(t.end))
    for txn in committed:
        for change in txn.surviving_changes():
            version = defs[change["table"]].version_at(change["scn"])
            apply_change(state, keys, {change["table"]: list(version.names)}, change)
    for name, table in defs.items():
        defaults = {c.name: c.default for v in table.versions for c in v.columns}
        rows = [{c: row.get(c, defaults.get(c)) for c in table.latest.names} for row in state[name].values()]
        assert truth["tables"][name]["columns"] == list(table.latest.names)
        assert canonical(rows) == canonical(truth["tables"][name]["rows"]), name
    loyalty = [row["loyalty_tier"] for row in truth["tables"]["shop.customers"]["rows"]]
    assert "standard" in loyalty and "gold" in loyalty


def test_without_schema_changes_the_archive_is_what_it_always_was(tmp_path):
    from trailbound.sources.simulator import simulate

    plain = simulate(tmp_path / "a" / "archive", tmp_path / "a" / "truth.json", records=800, hours=2, seed=4)
    none = simulate(tmp_path / "b" / "archive", tmp_path / "b" / "truth.json", records=800, hours=2, seed=4,
                    schema_changes="none")
    assert "schema_changes" not in plain.features
    for file in sorted((tmp_path / "a" / "archive").iterdir()):
        assert file.read_bytes() == (tmp_path / "b" / "archive" / file.name).read_bytes()
    assert all(len(t.versions) == 1 for t in load_defs(tmp_path / "a" / "archive").values())


# ---------------------------------------------------------------- the simulated pipeline across versions

@pytest.mark.spark
@pytest.mark.pg
@pytest.mark.long_running(120)
def test_a_simulated_archive_with_schema_changes_reaches_its_truth_on_the_target(tmp_path, spark, store, target_dsn,
                                                                               capsys, monkeypatch):
    """The demo's pieces on an archive with every kind of change: `target create` makes
    each table as replicat would leave it (the added column with its DEFAULT, the dropped
    one kept, the new table), capture numbers the records, replicat crosses each version
    (the ALTER's own transaction holds rows of both), and the Great Expectations check
    against the truth passes: the older row of that transaction holds the DEFAULT, as on
    the source."""
    from replicat_kit import write_config

    from trailbound import cli
    from trailbound import config as configuration
    from trailbound.capture.run import run_extract
    from trailbound.quality import validate_new_trail, validate_replica
    from trailbound.replicat.run import run_replicat
    from trailbound.sources.simulator import simulate

    simulate(tmp_path / "archive", tmp_path / "truth.json", records=2_500, hours=6, seed=3, schema_changes="all")
    config_path = write_config(tmp_path, grouptransops=200)
    config_path.write_text(config_path.read_text().replace("altarchivelogdest: archive\n",
                                                           "altarchivelogdest: archive\n    truth: truth.json\n"))
    config = configuration.load(config_path)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    assert cli.main(["--config", str(config_path), "target", "create"]) == 0
    assert "shop.reviews" in capsys.readouterr().out
    run_extract(spark, store, config, "EXT1")
    trail_check = validate_new_trail(store, "EXT1", "SRC", 0)  # the demo's capture DAG's Great Expectations
    assert trail_check.report.success and trail_check.files, trail_check.report.describe()
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.ddl == []  # the target was made from the latest versions: nothing left to alter
    checked = validate_replica(config, store, "REP1", target_dsn=target_dsn)
    assert checked.success, checked.describe()
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT count(*) FILTER (WHERE loyalty_tier = 'standard'), count(*) FILTER (WHERE loyalty_tier"
                    " = 'gold'), count(*) FILTER (WHERE notes IS NOT NULL) FROM shop.customers")
        standard, gold, notes = cur.fetchone()
        cur.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                    "'hr.timesheets'::regclass AND attname = 'emp_id'")
        assert cur.fetchone() == ("bigint",)
    connection.close()
    assert standard and gold and notes  # the old rows' DEFAULT, new values, the kept column's old values
    # INFO: each changed table's current version, since which scn and log time.
    defs = load_defs(tmp_path / "archive")
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), "info", "source"]) == 0
    assert cli.main(["--config", str(config_path), "info", "extract", "EXT1"]) == 0
    shown = capsys.readouterr().out
    customers = defs["shop.customers"].latest
    assert f"Table shop.customers: version 3 since scn {customers.scn} ({customers.time})" in shown
    assert "Table Versions       Table shop.customers: version 3 since scn" in shown
    assert "                     Table hr.timesheets: version 2 since scn" in shown
    assert "Table shop.reviews: version 1 since scn" in shown and "shop.orders" not in shown
    # The replica check's other expected state, the fold of the trail (used before the
    # truth is complete): a row inserted under an earlier version holds the columns
    # added since at their DEFAULT, so every row is judged whole, and as the truth has it.
    from trailbound.positions import TrailPosition
    from trailbound.replicat import expected
    from trailbound.trail import format as trail

    files = [(int(path.name[-9:]), str(path)) for path in sorted(trail.existing_files(tmp_path / "dirdat" / "lt"))]
    folded = expected.from_trail(files, TrailPosition(files[-1][0] + 1, 0), load_defs(tmp_path / "archive"))
    customers = folded["shop.customers"]
    truth = json.loads((tmp_path / "truth.json").read_text())["tables"]["shop.customers"]
    by_id = {row["id"]: row for row in truth["rows"]}
    assert len(customers.rows) == len(customers.present) >= 10
    assert all(by_id[row["id"]] == {c: row[c] for c in truth["columns"]} for row in customers.rows
               if row["id"] in by_id)


def test_an_older_versions_insert_under_a_newer_plan_gets_the_added_columns_default():
    """Inside the transaction that changed the table (INSERT, ALTER TABLE ADD COLUMN ...
    DEFAULT, INSERT) the first row's image does not name the new column, but PostgreSQL
    gave the row the default: replicat applies it with that value, not NULL; a column
    the newer version dropped is left out."""
    from trailbound.archive.segments import Column, TableDef
    from trailbound.config import DdlConfig
    from trailbound.replicat import ddl
    from trailbound.replicat.target import IDENTITY

    first = (Column("id", "integer", False), Column("gone", "text", True))
    second = (first[0], Column("tier", "text", True, "standard"), Column("plain", "text", True))
    table = TableDef("shop.a", first, ("id",)).with_version(second, ("id",), 100)
    part = pa.table({"op": ["INSERT", "INSERT", "UPDATE", "INSERT"], "table": ["shop.a", "shop.a", "shop.a", "shop.b"],
                     "table_version": pa.array([1, 2, 1, 1], pa.int32())})
    images = ['{"id":1,"gone":"g"}', '{"id":2,"tier":null,"plain":"p"}', '{"id":1,"gone":"h"}', '{"k":"\\u00e9"}']
    planned = ddl.Versions({"shop.a": table}, IDENTITY, DdlConfig(), {"shop.a": 2})
    fitted = ddl.older_images_fitted(part, lambda: pa.chunked_array([images]), planned)
    assert [json.loads(i) for i in fitted().to_pylist()] == [
        {"id": 1, "tier": "standard"}, {"id": 2, "tier": None, "plain": "p"}, {"id": 1}, {"k": "é"}]
    decode = lambda: pa.chunked_array([images])  # noqa: E731
    at_first = ddl.Versions({"shop.a": table}, IDENTITY, DdlConfig(), {"shop.a": 1})
    assert ddl.older_images_fitted(part, decode, at_first) is decode  # nothing older than the plan


def test_refreshing_defs_keeps_every_version_and_adds_one_only_for_a_table_that_changed():
    from trailbound.archive.segments import Column, TableDef
    from trailbound.sources.postgres.admin import refreshed_defs

    first = (Column("id", "integer", False), Column("note", "text", True))
    second = first + (Column("flag", "text", False, "yes"),)
    orders = TableDef("shop.orders", first, ("id",)).with_version(second, ("id",), 500)
    items = TableDef("shop.items", (Column("sku", "text", False),), ("sku",))
    kept = {"shop.orders": orders, "shop.items": items, "shop.gone": items.__class__("shop.gone", first, ("id",))}
    same = [{"name": "shop.orders", "key": ["id"], "columns": [
        {"name": "id", "type": "integer", "nullable": False}, {"name": "note", "type": "text", "nullable": True},
        {"name": "flag", "type": "text", "nullable": False, "default": "yes"}]},
        {"name": "shop.items", "key": ["sku"], "columns": [{"name": "sku", "type": "text", "nullable": False}]}]
    merged, changed = refreshed_defs(kept, same, 900)
    assert merged == kept and changed == []  # nothing differs: nothing added, history and shop.gone kept
    wider = [{**same[0]}, {**same[1], "columns": same[1]["columns"] + [{"name": "price", "type": "numeric",
                                                                         "nullable": True}]},
             {"name": "shop.new", "key": [], "columns": [{"name": "x", "type": "text", "nullable": True}]}]
    merged, changed = refreshed_defs(kept, wider, 900)
    assert changed == ["shop.items v2", "shop.new v1"]
    assert [(v.version, v.scn) for v in merged["shop.items"].versions] == [(1, 0), (2, 900)]
    assert merged["shop.orders"] == orders and merged["shop.orders"].latest.columns[-1].default == "yes"
    assert [(v.version, v.scn) for v in merged["shop.new"].versions] == [(1, 0)]


def test_a_schema_change_the_simulator_cannot_write_is_refused(tmp_path):
    from trailbound.sources.simulator import SchemaChange, simulate

    for change in (SchemaChange(0.5, "drop_column", "shop.customers", "nope"),
                   SchemaChange(0.5, "add_column", "shop.customers", "notes", "text"),
                   SchemaChange(0.5, "create_table", "shop.orders")):
        with pytest.raises(ValueError, match="SchemaChange|simulator|no such"):
            simulate(tmp_path / "archive", tmp_path / "truth.json", records=100, hours=1, schema_changes=(change,))
    with pytest.raises(ValueError, match="one of"):
        simulate(tmp_path / "archive", tmp_path / "truth.json", records=100, hours=1, schema_changes="most")
