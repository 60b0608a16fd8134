"""Many tables through the live pipeline (issue 42 item 5; the cost per change is
tests/bench/bench_many_tables.py's, docs/benchmarks/many-tables.md): 40 tables in 3
schemas, every key kind (integer, composite, uuid, none with REPLICA IDENTITY FULL) and
8 of 64 mixed columns (jsonb, bytea, arrays, timestamptz, numeric...), under seeded
random transactions touching 1 to 20 tables each. Two rounds of `archive pull`, capture,
pump and replicat: the first without updates or deletes of the keyless tables (every
group applied as a set: hundreds of tables staged in one chunk), the second with them
(their records replayed one by one inside the groups, the other tables' rows applied as
sets in the same target transactions: no group replayed whole). After each round the
target equals the source table by table, and every table's inserts reached the trail as
COPY lines (capture formats hundreds of tables' lines in batches)."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from many_tables_kit import create_tables, tables_for, workload
from pg_source_kit import SOURCE_ENV, digests, source_dsn, source_server, write_config  # noqa: F401
from trailbound import cli
from trailbound import config as configuration
from trailbound.capture.run import run_extract
from trailbound.pump.run import run_pump
from trailbound.replicat.run import run_replicat
from trailbound.trail import format as trail

pytestmark = [pytest.mark.spark, pytest.mark.pg]

TABLES = tables_for(40, schemas=3)
NAMES = [(schema, table) for schema, table, _ in TABLES]


@pytest.mark.long_running(90)
def test_forty_tables_of_every_key_kind_under_random_transactions(source_dsn, target_dsn, store, spark, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    config_path = write_config(tmp_path, tables=sorted({f"{schema}.*" for schema, _ in NAMES}),
                               segment={"records": 2000})
    config = configuration.load(config_path)
    create_tables(source_dsn, TABLES)
    assert cli.main(["--config", str(config_path), "add", "source", "PG"]) == 0
    assert cli.main(["--config", str(config_path), "target", "create"]) == 0
    next_ids = [1] * len(TABLES)

    for round_, keyless_changes in ((1, False), (2, True)):
        transactions = workload(source_dsn, TABLES, 4000, seed=round_, keyless_changes=keyless_changes,
                                first_ids=next_ids)
        assert transactions > 100
        assert cli.main(["--config", str(config_path), "archive", "pull", "PG"]) == 0
        run_extract(spark, store, config, "EXT1")
        run_pump(None, store, config, "PMP1")
        result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        source = digests(source_dsn, NAMES)
        assert all(count for count, _ in source.values()), "every table holds rows"
        different = {name: (found, source[name]) for name, found in digests(target_dsn, NAMES).items()
                     if found != source[name]}
        assert not different, f"round {round_}: the target differs from the source: {different}"
        if keyless_changes:
            assert result.replayed_records and not result.replayed_groups, \
                "the keyless tables' updates and deletes are replayed inside groups applied as sets"
        else:
            assert not result.replayed_groups, "every group applied as a set"

    # Every table's inserts carry their COPY lines in the trail.
    records = [trail.read_file(path) for path in sorted((tmp_path / "dirdat").glob("lt*"))]
    lined = set()
    for table in records:
        inserts = table.filter(pc.equal(table["op"], "INSERT"))
        assert inserts["copy_line"].null_count == 0
        lined |= set(inserts["table"].to_pylist())
    assert lined == {f"{schema}.{table}" for schema, table in NAMES}
