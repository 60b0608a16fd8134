"""Trail format 2's copy lines (docs/trail-format.md): each INSERT's row as a COPY text
line, written in a layout recorded in the file (and covered by its content digest);
version 1 files read with none; capture writes them in defs.json's layout; a filtered
pump carries them; replicat applies a line only where the file's layout is its plan's,
and steps aside where a key repeats in a unit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bad_input_kit import _rewrite_trail
from capture_kit import TABLES as KIT_TABLES
from capture_kit import write_config as capture_config
from pump_kit import SourceTrail, committed_files, read_trail, records_of
from pump_kit import write_config as pump_config
from replicat_kit import write_config as replicat_config
from test_replicat import _create_target
from trailbound import config as configuration
from trailbound import copytext
from trailbound.archive.segments import load_defs
from trailbound.archive.writer import write_defs
from trailbound.capture.run import run_extract
from trailbound.durable import file_sha256
from trailbound.errors import TrailError
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, Scn
from trailbound.pump.run import run_pump
from trailbound.replicat.run import run_replicat
from trailbound.trail import format as trail

pytestmark = [pytest.mark.pg]


def _text(image):
    return image if image is None or isinstance(image, str) else json.dumps(image)


def _records(transactions: list[tuple[str, list[tuple]]], scn: int = 100) -> pa.Table:
    """Trail records (no copy lines) of `transactions`, each (xid, [(op, table, before,
    after)]), images as dicts or JSON text; numbered as pump_kit.records_of numbers them
    (commit SCNs from `scn` + 10 on)."""
    rows, _ = records_of([(xid, [(table, 0) for _, table, _, _ in changes]) for xid, changes in transactions], scn)
    for row, (op, _, before, after) in zip(rows, [c for _, changes in transactions for c in changes]):
        row.update(op=op, before=_text(before), after=_text(after))
    return pa.Table.from_pylist(rows, trail.SCHEMA)


def _lines_differing_from_images(line_transactions, image_transactions, layouts) -> pa.Table:
    """Records whose images are `image_transactions`' and whose copy lines (and their
    layouts) were made from `line_transactions`' images: which of the two reaches the
    target tells which way replicat took."""
    lined = trail.with_copy_lines(_records(line_transactions), layouts)
    assert trail.copy_line_layouts(lined) == layouts
    return lined.set_column(lined.schema.get_field_index("after"), "after", _records(image_transactions)["after"])


# ---------------------------------------------------------------- the lines a writer writes

T_LAYOUT = (("id", "integer"), ("note", "text"), ("score", "float"), ("ok", "boolean"), ("big", "integer"),
            ("amount", "text"))


def test_written_lines_are_the_images_as_copy_text_and_the_digest_covers_them(tmp_path):
    """Every writer (a single file, capture's planned files, the batch writer) writes the
    same file: each INSERT of a table with a layout carries its row as COPY text, written
    out by hand below; other records and tables carry none; the footer names only the
    tables given lines; a line or a layout changed behind the footer's back is caught."""
    assert copytext.layout(["id", "note", "score", "ok", "big", "amount"],
                           ["bigint", "text", "double precision", "boolean", "bigint", "numeric"]) == T_LAYOUT
    awkward = {"id": 1, "note": "tab\there\nnew\\line\r end", "score": 1.5, "ok": True, "big": 9223372036854775807,
               "amount": "12345.678901234567890"}
    nulls = {"id": 2, "note": None, "score": -0.25, "ok": False, "big": -9223372036854775808, "amount": None}
    records = _records([
        ("T1", [("INSERT", "s.t", None, awkward),
                ("INSERT", "s.t", None, json.dumps(nulls | {"note": "Zoë 🚀 北京 \\N"}, ensure_ascii=True)),
                ("INSERT", "s.other", None, {"k": 1}),                                  # no layout: no line
                ("UPDATE", "s.t", {"id": 1}, {"id": 1, "note": "changed"})]),
        ("T2", [("DELETE", "s.t", {"id": 2}, None),
                ("UPDATE", "s.u", {"k": 4}, {"k": 5}),                                  # a layout, no insert
                # Keys in another order, one left out (NULL), a numeric string as it is.
                ("INSERT", "s.t", None, '{"amount": "0.10", "big": 0, "ok": null, "note": "", "id": 3}')]),
    ])
    layouts = {"s.t": T_LAYOUT, "s.u": (("k", "integer"),)}
    expected = ["1\ttab\\there\\nnew\\\\line\\r end\t1.5\ttrue\t9223372036854775807\t12345.678901234567890\n",
                "2\tZoë 🚀 北京 \\\\N\t-0.25\tfalse\t-9223372036854775808\t\\N\n",
                None, None, None, None,
                "3\t\t\\N\t\\N\t0\t0.10\n"]

    single = trail.write_file(tmp_path / "a" / "lt", 1, trail.with_copy_lines(records, layouts), group="EXT1",
                              log_bsn=Scn(50))
    planned_input = records.drop_columns(["rba", "trans_ind", "copy_line"]).append_column(
        "file_no", pa.array([0] * len(records), pa.int64()))
    [planned] = trail.write_planned_files(tmp_path / "b" / "lt", 1, planned_input.to_batches(max_chunksize=3),
                                          group="EXT1", log_bsn=Scn(50), layouts=layouts)
    writer = trail.TrailWriter(tmp_path / "c" / "lt", 1, max_bytes=1 << 30, group="EXT1", log_bsn=Scn(50),
                               layouts=layouts)
    for batch in records.drop_columns(["copy_line"]).to_batches(max_chunksize=3):
        writer.add(batch)
    [batched] = writer.close()
    assert planned.sha256 == single.sha256 == batched.sha256

    written = trail.read_file(single.path)
    assert written["copy_line"].to_pylist() == expected
    assert trail.copy_line_layouts(written) == {"s.t": T_LAYOUT}
    assert b"trailbound.copy_line_layouts" in pq.read_metadata(single.path).metadata, "the layouts are in the footer"
    assert trail.read_metadata(single.path)["format_version"] == trail.FORMAT_VERSION == 4
    # The images themselves are kept as they were written.
    assert written["after"].to_pylist() == records["after"].to_pylist()

    # A file written without layouts has no lines, and says so.
    bare = trail.write_file(tmp_path / "d" / "lt", 1, records, group="EXT1", log_bsn=Scn(50))
    assert trail.read_file(bare.path)["copy_line"].null_count == len(records)
    assert trail.copy_line_layouts(trail.read_file(bare.path)) == {}

    # The content digest covers the lines and their layouts: either changed under the
    # footer is refused, with the file's name. (Rewriting the file as it is is not.)
    def changed_line(table, meta):
        lines = table["copy_line"].to_pylist()
        lines[0] = lines[0].replace("1.5", "2.5")
        column = table.schema.get_field_index("copy_line")
        return table.set_column(column, table.schema.field(column), pa.array(lines, pa.string())), meta

    def changed_layout(table, meta):
        field = table.schema.field("copy_line")
        other = {b"trailbound.copy_line_layouts": json.dumps({"s.t": [["id", "integer"], ["note", "text"]]}).encode()}
        return table.cast(table.schema.set(table.schema.get_field_index("copy_line"), field.with_metadata(other))), meta

    for change, damaged in [(lambda table, meta: (table, meta), False), (changed_line, True),
                            (changed_layout, True)]:
        copy = tmp_path / "e" / "lt000000001"
        copy.parent.mkdir(exist_ok=True)
        copy.write_bytes(single.path.read_bytes())
        _rewrite_trail(copy, change)
        if not damaged:
            assert trail.read_file(copy)["copy_line"].to_pylist() == expected
            continue
        with pytest.raises(TrailError, match="content checksum does not match its metadata") as error:
            trail.read_file(copy)
        assert error.value.path == str(copy)


def test_many_tables_get_the_lines_each_would_get_alone():
    """Tables are parsed in batches (copytext.insert_lines): tables sharing a column of
    another kind, a table whose image does not fit its layout, tables of one layout and
    of others, interleaved: every line is the one its table alone gets, and the table
    whose image does not fit gets none while the tables batched with it keep theirs."""
    layouts = {f"s.t{i}": T_LAYOUT for i in range(4)}
    layouts |= {"s.text_id": (("id", "text"), ("note", "text")),        # `id` of another kind: another batch
                "s.narrow": (("id", "integer"), ("ok", "boolean")),
                "s.bad": (("id", "integer"), ("note", "text"))}
    changes = []
    for n in range(40):
        table = f"s.t{n % 4}"
        changes.append(("INSERT", table, None, {"id": n, "note": f"n\t{n}", "score": n / 4, "ok": n % 2 == 0,
                                                 "big": n * 10, "amount": f"{n}.5"}))
        changes.append(("INSERT", "s.text_id", None, {"id": f"k{n}", "note": None}))
        changes.append(("INSERT", "s.narrow", None, {"id": n, "ok": None, "unknown": [1]}))
        changes.append(("UPDATE", table, {"id": n}, {"id": n, "note": "x"}))
    changes.insert(7, ("INSERT", "s.bad", None, {"id": 1, "note": "fits"}))
    changes.insert(30, ("INSERT", "s.bad", None, {"id": "not an integer", "note": "x"}))
    records = _records([(f"T{i}", changes[i:i + 9]) for i in range(0, len(changes), 9)])

    lines, used = copytext.insert_lines(records, layouts)
    alone = [None] * len(records)
    for name, table_layout in layouts.items():
        mine = [i for i, (op, table) in enumerate(zip(records["op"].to_pylist(), records["table"].to_pylist()))
                if op == "INSERT" and table == name]
        one, one_used = copytext.insert_lines(records.take(mine), {name: table_layout})
        assert (name in used) == (name in one_used)
        for i, line in zip(mine, one.to_pylist()):
            alone[i] = line
    assert lines.to_pylist() == alone
    assert set(used) == set(layouts) - {"s.bad"}
    assert alone[0] == "0\tn\\t0\t0\ttrue\t0\t0.5\n" and alone[1] == "k0\t\\N\n" and alone[2] == "0\t\\N\n"


# ---------------------------------------------------------------- replicat

ITEMS = {"name": "shop.items", "key": ["id"], "columns": [   # the key is not the first column
    {"name": "note", "type": "text", "nullable": True}, {"name": "id", "type": "bigint", "nullable": False},
    {"name": "memo", "type": "text", "nullable": True}, {"name": "n", "type": "double precision", "nullable": True}]}
ITEMS_LAYOUT = (("note", "text"), ("id", "integer"), ("memo", "text"), ("n", "float"))


def _home(tmp_path: Path, tables, **options) -> tuple[configuration.Config, Path]:
    """A home with defs.json for `tables` and replicat REP1 on dirdat/lt; the trail's prefix."""
    write_defs(tmp_path / "archive", tables)
    config = configuration.load(replicat_config(tmp_path, tables=("shop.*", "hr.*"), **options))
    return config, Path(config.trail_location("dirdat/lt"))


def _commit_files(store, prefix: Path, tables: list[pa.Table]) -> None:
    source = SourceTrail(store, prefix)
    for seqno, table in enumerate(tables, start=1):
        source.commit(trail.write_file(prefix, seqno, table, group="EXT1", log_bsn=Scn(50)))


def _rows(target_dsn: str, table: str, columns: str) -> list[tuple]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(f"SELECT {columns} FROM {table} ORDER BY id")
        return cur.fetchall()


def _item(key: int, note: str, n=5, memo=None) -> dict:
    return {"note": note, "id": key, "memo": memo if memo is not None else f"memo-{key}", "n": n}


@pytest.mark.parametrize("layout", ["the plan's", "another kind", "another order"])
def test_replicat_applies_a_line_only_in_its_plans_layout(tmp_path, store, target_dsn, layout):
    """Lines that say "from-line" where the images say "from-image": the target shows which
    replicat applied. In its plan's layout (defs.json's columns in order, the target's
    JSON kinds) the line; when the target's type for a column is of another JSON kind
    (an integer column where the source had a float), or the file's layout has the
    columns in another order (defs.json changed since the file was written), the image."""
    config, prefix = _home(tmp_path, [ITEMS])

    def transactions(note):
        return [("T1", [("INSERT", "shop.items", None, _item(1, note)),
                        ("INSERT", "shop.items", None, _item(2, note))]),
                ("T2", [("INSERT", "shop.items", None, _item(3, note, n=7))])]

    # Another order of the same kinds: a line trusted wrongly would be applied, wrong.
    file_layout = {"another order": (("memo", "text"), ("id", "integer"), ("note", "text"), ("n", "float"))}.get(
        layout, ITEMS_LAYOUT)
    table = _lines_differing_from_images(transactions("from-line"), transactions("from-image"),
                                         {"shop.items": file_layout})
    _commit_files(store, prefix, [table])
    if layout == "another kind":
        with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
            cur.execute("CREATE SCHEMA shop; CREATE TABLE shop.items (note text, id bigint PRIMARY KEY, memo text, "
                        "n integer)")
    else:
        _create_target(config, target_dsn)
    result = run_replicat(None, store, config, "REP1", target_dsn=target_dsn)  # no Spark: none is needed
    # Not replayed either: a line applied where it does not fit fails its COPY, and the
    # replay from the images would hide it.
    assert (result.transactions, result.replayed_groups) == (2, 0)
    note = "from-line" if layout == "the plan's" else "from-image"
    assert _rows(target_dsn, "shop.items", "id, note, memo, n") == [(1, note, "memo-1", 5), (2, note, "memo-2", 5),
                                                                    (3, note, "memo-3", 7)]


def test_lines_of_a_two_column_key_that_repeats_nowhere_are_applied_as_they_are(tmp_path, store, target_dsn):
    """A key of two columns whose first repeats within the group (id 1 twice) but whose
    pairs do not: replicat checks the pairs, and copies the lines ("from-line")."""
    pairs = {**ITEMS, "key": ["id", "memo"]}
    config, prefix = _home(tmp_path, [pairs])

    def transactions(note):
        return [("T1", [("INSERT", "shop.items", None, _item(1, note, memo="a")),
                        ("INSERT", "shop.items", None, _item(1, note, memo="b"))]),
                ("T2", [("INSERT", "shop.items", None, _item(2, note, memo="a"))])]
    _commit_files(store, prefix, [_lines_differing_from_images(transactions("from-line"), transactions("from-image"),
                                                               {"shop.items": ITEMS_LAYOUT})])
    _create_target(config, target_dsn)
    result = run_replicat(None, store, config, "REP1", target_dsn=target_dsn)
    assert (result.transactions, result.replayed_groups) == (2, 0)
    assert sorted(_rows(target_dsn, "shop.items", "id, memo, note")) == [
        (1, "a", "from-line"), (1, "b", "from-line"), (2, "a", "from-line")]


def test_the_images_of_lined_inserts_are_decoded_when_a_refused_group_is_replayed(tmp_path, store, target_dsn):
    """Replicat reads a part of lined inserts without its after images (it applies the
    lines): a group the target refuses (it holds one of the keys already) is replayed
    record by record from the images, decoded then, and the error names the record and
    the key its image carries."""
    config, prefix = _home(tmp_path, [ITEMS])
    transactions = [("T1", [("INSERT", "shop.items", None, _item(1, "a")),
                            ("INSERT", "shop.items", None, _item(2, "b"))]),
                    ("T2", [("INSERT", "shop.items", None, _item(3, "c"))])]
    _commit_files(store, prefix, [trail.with_copy_lines(_records(transactions), {"shop.items": ITEMS_LAYOUT})])
    _create_target(config, target_dsn)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("INSERT INTO shop.items (note, id, memo, n) VALUES ('there already', 2, 'x', 1)")
    with pytest.raises(Exception) as refused:
        run_replicat(None, store, config, "REP1", target_dsn=target_dsn)
    message = str(refused.value)
    assert f"{prefix}000000001 rba 1" in message and '"id": 2' in message and "INSERT on shop.items" in message
    assert _rows(target_dsn, "shop.items", "id, note") == [(2, "there already")]


def _apply_trail(tmp_path: Path, metadata_dsn: str, target_dsn: str, table: pa.Table, tables) -> tuple:
    """`table` as a one-file trail applied by replicat in one group: the target's rows and
    the number of groups replayed (a failed COPY is replayed from the images), or the
    error replicat stopped with."""
    config, prefix = _home(tmp_path, tables)
    with MetadataStore.open(metadata_dsn) as store:
        _commit_files(store, prefix, [table])
        _create_target(config, target_dsn)
        try:
            result = run_replicat(None, store, config, "REP1", target_dsn=target_dsn)
        except Exception as exc:  # noqa: BLE001 - what the run without lines does, compared below
            return f"{type(exc).__name__}: {str(exc).replace(str(tmp_path), '<home>')}", None
    return _rows(target_dsn, "shop.items", "id, note, memo, n"), result.replayed_groups


@pytest.mark.parametrize("key_at", ["first", "second", "two columns"])
def test_a_key_inserted_twice_in_a_unit_is_applied_as_without_lines(tmp_path, new_metadata_database, target_dsn,
                                                                    empty_database_dsn, key_at):
    """Two INSERTs of one key in one group (a unit): their lines cannot simply be copied.
    Replicat tells from the lines that the key repeats (read from the line's first field,
    from the field at the key's column, or from the fields of a two-column key) and takes
    the image's way for them, so the target ends as it does for the same trail without
    lines."""
    columns = ITEMS["columns"] if key_at != "first" else [ITEMS["columns"][1], ITEMS["columns"][0],
                                                          *ITEMS["columns"][2:]]
    items = {**ITEMS, "columns": columns, "key": ["id", "memo"] if key_at == "two columns" else ["id"]}
    transactions = [("T1", [("INSERT", "shop.items", None, _item(1, "first", memo="a")),
                            ("INSERT", "shop.items", None, _item(2, "other"))]),
                    ("T2", [("INSERT", "shop.items", None, _item(1, "second", memo="a", n=6))])]
    records = _records(transactions)
    layout = copytext.layout([c["name"] for c in columns], [c["type"] for c in columns])
    lined = trail.with_copy_lines(records, {"shop.items": layout})
    assert lined["copy_line"].null_count == 0 and lined["copy_line"][0].as_py().startswith("1\t" if key_at == "first"
                                                                                          else "first\t1\t")
    with_lines, replayed = _apply_trail(tmp_path / "lines", new_metadata_database(), target_dsn, lined, [items])
    without, _ = _apply_trail(tmp_path / "images", new_metadata_database(), empty_database_dsn, records, [items])
    assert with_lines == without
    # Netted, not copied as they are: two lines of one key fail their COPY, and the
    # replay from the images would hide that.
    assert replayed == 0


# ---------------------------------------------------------------- version 1 files

def _write_version_1(prefix: Path, seqno: int, records: pa.Table) -> trail.TrailFileInfo:
    """A trail file as format version 1 wrote it: no copy_line column, its footer's digest
    of the version 1 columns (trail.write_file is the model)."""
    table = records.select([name for name in trail.COLUMNS if name != "copy_line"])
    rows = table.to_pylist()
    first, last = Csn.from_row(rows[0]), Csn.from_row(rows[-1])
    meta = {"format_version": 1, "group": "EXT1", "trail": prefix.name, "seqno": seqno, "records": len(table),
            "first_csn": str(first), "last_csn": str(last), "log_bsn": 50,
            "content_sha256": trail._content_digest(table, 1)}
    path = trail.trail_path(prefix, seqno)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata({trail._METADATA_KEY: json.dumps(meta).encode()}), path,
                   compression="zstd", write_page_checksum=True)
    return trail.TrailFileInfo(seqno, path, len(table), path.stat().st_size, file_sha256(path), first, last, Scn(50))


def test_a_version_1_file_reads_without_lines_and_replicat_applies_it(tmp_path, store, target_dsn):
    """A version 1 file (before copy lines) reads with an all-NULL copy_line, its own
    digest checked; replicat applies it and a version 2 file with lines after it (the
    two files' records side by side in one chunk)."""
    config, prefix = _home(tmp_path, [ITEMS])
    old = _records([("T1", [("INSERT", "shop.items", None, _item(1, "one")),
                            ("INSERT", "shop.items", None, _item(2, "two")),
                            ("INSERT", "shop.items", None, _item(3, "three"))]),
                    ("T2", [("UPDATE", "shop.items", {"id": 2}, {"id": 2, "note": "changed"}),
                            ("DELETE", "shop.items", {"id": 3}, None)])])
    info = _write_version_1(prefix, 1, old)
    assert "copy_line" not in pq.read_schema(info.path).names
    assert trail.read_metadata(info.path)["format_version"] == 1
    read = trail.read_file(info.path)
    assert read.schema.names == trail.COLUMNS and read["copy_line"].null_count == len(old)
    assert read.drop_columns(["copy_line"]).equals(old.drop_columns(["copy_line"]))
    assert trail.copy_line_layouts(read) == {}
    parts = list(trail.read_parts(info.path, sha256=info.sha256, records=info.records))
    assert [part["copy_line"].null_count for part in parts] == [len(old)]

    new = _records([("T3", [("INSERT", "shop.items", None, _item(4, "four")),
                            ("INSERT", "shop.items", None, _item(5, "five", n=1.25))])], scn=500)
    new = trail.with_copy_lines(new, {"shop.items": ITEMS_LAYOUT})
    source = SourceTrail(store, prefix)
    source.commit(info)
    source.commit(trail.write_file(prefix, 2, new, group="EXT1", log_bsn=Scn(50)))
    _create_target(config, target_dsn)
    result = run_replicat(None, store, config, "REP1", target_dsn=target_dsn)
    assert result.transactions == 3
    assert _rows(target_dsn, "shop.items", "id, note, memo, n") == [
        (1, "one", "memo-1", 5), (2, "changed", "memo-2", 5), (4, "four", "memo-4", 5), (5, "five", "memo-5", 1.25)]


# ---------------------------------------------------------------- capture and pump

_UNESCAPE = {"\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t"}


def _fields(line: str) -> list[str | None]:
    """A COPY text line's values (NULL as None), unescaped: the reading side of the format."""
    assert line.endswith("\n") and "\n" not in line[:-1]
    return [None if field == "\\N" else re.sub(r"\\[\\nrt]", lambda m: _UNESCAPE[m.group(0)], field)
            for field in line[:-1].split("\t")]


def _holds(field: str | None, value) -> bool:
    """Whether a line's field is the image's JSON value written as PostgreSQL text input."""
    if value is None or field is None:
        return value is None and field is None
    if isinstance(value, bool):
        return field == ("true" if value else "false")
    if isinstance(value, float):
        return float(field) == value
    return field == str(value)


@pytest.mark.spark
@pytest.mark.long_running(20)
def test_capture_writes_each_insert_as_a_copy_line_in_defs_order(tmp_path, spark, store):
    """Capture of a simulated source (every awkward type) into several files: each INSERT
    carries a line, its image's values in defs.json's column order, as copytext formats
    them (and as a COPY reader reads them back); no other record carries one; each file's
    layouts are defs.json's for the tables it inserts into."""
    from trailbound.sources.simulator import simulate

    simulate(tmp_path / "archive", tmp_path / "truth.json", records=1500, hours=3, seed=5)
    config = configuration.load(capture_config(tmp_path, tables=("shop.*", "hr.*"), megabytes=0.05))
    run_extract(spark, store, config, "EXT1")
    defs = load_defs(tmp_path / "archive")
    layouts = copytext.layouts_of(defs)
    files = committed_files(store, str(config.trail_location("dirdat/lt")))
    assert len(files) >= 3
    inserts = 0
    for row in files:
        table = trail.read_file(row["path"])
        records = table.to_pylist()
        inserted = {r["table"] for r in records if r["op"] == "INSERT"}
        assert trail.copy_line_layouts(table) == {name: layouts[name] for name in inserted}, row["path"]
        for record in records:
            if record["op"] != "INSERT":
                assert record["copy_line"] is None, record
                continue
            inserts += 1
            columns = [c.name for c in defs[record["table"]].columns]
            types = [c.type for c in defs[record["table"]].columns]
            parsed = copytext.parse_images(pa.array([record["after"]]), tuple(columns), tuple(types))
            [expected] = copytext.copy_lines([copytext.copy_values(column) for column in parsed.columns]).to_pylist()
            assert record["copy_line"] == expected, record
            image = json.loads(record["after"])
            fields = _fields(record["copy_line"])
            assert len(fields) == len(columns) and all(_holds(f, image.get(c)) for f, c in zip(fields, columns)), \
                (record["copy_line"], image)
    assert inserts > 300


@pytest.mark.spark
def test_capture_without_readable_defs_writes_no_lines(tmp_path, spark, store):
    """An archive whose defs.json cannot be read still captures (capture does not need
    the definitions); its inserts carry no lines and its files no layouts."""
    from capture_kit import ins, new_archive, rec

    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), ins(11, "T1", 2), rec(12, "T1", "COMMIT")], 100)
    (tmp_path / "archive" / "defs.json").write_text("{not json")
    config = configuration.load(capture_config(tmp_path))
    run_extract(spark, store, config, "EXT1")
    [row] = committed_files(store, str(config.trail_location("dirdat/lt")))
    table = trail.read_file(row["path"])
    assert table["op"].to_pylist() == ["INSERT", "INSERT"]
    assert table["copy_line"].null_count == 2 and trail.copy_line_layouts(table) == {}


def test_a_filtering_pump_keeps_the_lines_of_the_tables_it_ships(tmp_path, store, target_dsn):
    """A pump with a TABLE filter rewrites each file: the shipped records keep their lines
    and the file keeps their layouts, so the replicat of the remote trail applies the
    lines (they say "from-line", the images "from-image")."""
    write_defs(tmp_path / "archive", KIT_TABLES)
    config = configuration.load(pump_config(
        tmp_path, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt", "table": ["shop.*"]}},
        replicats={"REP1": {"exttrail": "remote/rt", "source": "SRC", "map": [{"source": "shop.*",
                                                                               "target": "shop.*"}]}}))
    layouts = copytext.layouts_of(load_defs(tmp_path / "archive"))

    def transactions(note):
        return [("A", [("INSERT", "shop.orders", None, {"id": 1, "note": note}),
                       ("INSERT", "hr.salaries", None, {"id": 2, "amount": "10.50"}),
                       ("INSERT", "shop.orders", None, {"id": 3, "note": note})]),
                ("B", [("INSERT", "hr.salaries", None, {"id": 4, "amount": None})]),
                ("C", [("UPDATE", "hr.salaries", {"id": 2}, {"id": 2, "amount": "11"}),
                       ("INSERT", "shop.orders", None, {"id": 5, "note": note})])]

    source = _lines_differing_from_images(transactions("from-line"), transactions("from-image"), layouts)
    prefix = Path(config.trail_location("dirdat/lt"))
    _commit_files(store, prefix, [source])
    run_pump(None, store, config, "PMP1")

    remote_key = str(config.trail_location("remote/rt"))
    [shipped] = committed_files(store, remote_key)
    remote = trail.read_file(shipped["path"])
    assert remote["table"].to_pylist() == ["shop.orders"] * 3
    expected = [r["copy_line"] for r in source.to_pylist() if r["table"] == "shop.orders"]
    assert remote["copy_line"].to_pylist() == expected == [f"{k}\tfrom-line\n" for k in (1, 3, 5)]
    assert trail.copy_line_layouts(remote)["shop.orders"] == layouts["shop.orders"]
    assert [r["copy_line"] for r in read_trail(store, remote_key)] == expected

    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("CREATE SCHEMA shop; CREATE TABLE shop.orders (id bigint PRIMARY KEY, note text)")
    run_replicat(None, store, config, "REP1", target_dsn=target_dsn)
    assert _rows(target_dsn, "shop.orders", "id, note") == [(1, "from-line"), (3, "from-line"), (5, "from-line")]
