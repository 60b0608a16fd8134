"""Replicat: net change on Spark, apply to a real PostgreSQL target exactly once through the
checkpoint table; crashes, a restored target and lost trails all converge to the source's
truth; errors name the trail record; HANDLECOLLISIONS; alter and info."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg2
import psycopg2.extensions
import pyarrow as pa
import pytest
from psycopg2 import sql

from capture_kit import at, ins, new_archive, rec
from replicat_kit import checkpoint_row, differences, write_config
from trailbound import cli
from trailbound.trail import format as trail
from trailbound import config as configuration
from trailbound import idle
from trailbound.archive.segments import load_defs
from trailbound.capture.run import run_extract
from trailbound.crash import CRASH_ENV
from trailbound.errors import TrailboundError
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, Scn, TrailPosition
from trailbound.replicat import checkpoints as ckpt
from trailbound.replicat import target as tgt
from trailbound.replicat.apply import ApplyError
from trailbound.replicat.net import Shape, format_line
from trailbound.replicat.net import arrow as netarrow
from trailbound.replicat.net.spark import copy_lines, net_changes, net_rows
from trailbound.replicat.chunks import Piece, TrailFile, cut, group_transactions, plan_chunk
from trailbound.replicat.run import run_replicat

pytestmark = [pytest.mark.spark, pytest.mark.pg]


# ---------------------------------------------------------------- groups and units (no Spark)

def _trail_table(transactions: list[list[tuple[str, str]]]) -> pa.Table:
    """A trail file's records: transactions of (op, table), one CSN each, in order."""
    rows = []
    for number, ops in enumerate(transactions, start=1):
        for index, (op, table) in enumerate(ops):
            ind = trail.WHOLE if len(ops) == 1 else trail.BEGIN if index == 0 else \
                trail.END if index == len(ops) - 1 else trail.MIDDLE
            rows.append({"rba": len(rows), "trans_ind": ind, "csn": 10 * number, "csn_thread": 1, "csn_sequence": 1,
                         "csn_rba": number, "xid": f"T{number}", "commit_ts": at(number), "op": op, "table": table,
                         "before": None, "after": "{}", "src_thread": 1, "src_sequence": 1, "src_rba": len(rows),
                         "src_scn": 10 * number - 1, "log_bsn": 5})
    return pa.Table.from_pylist(rows, schema=trail.SCHEMA)


def test_groups_hold_whole_transactions_and_a_truncate_starts_a_new_one():
    ins_, trunc = ("INSERT", "shop.orders"), ("TRUNCATE", "shop.cart_sessions")
    records = _trail_table([[ins_] * 3, [ins_] * 3, [ins_], [ins_, trunc, ins_], [ins_] * 2, [ins_]])
    chunk = plan_chunk([TrailFile(7, "lt000000007", len(records), "")], [records], Csn(10, 1, 1, 1),
                       grouptransops=4)
    # T1 is at or below log_csn: skipped. T2 (3 ops) + T3 reach 4 ops; T4 truncates, so it
    # starts a group (which T5 joins: 5 ops); T6 is the last.
    assert chunk.skipped == 1
    assert [g.txns for g in chunk.groups] == [[1, 2], [3, 4], [5]]
    assert [g.log_xid for g in chunk.groups] == ["T3", "T5", "T6"]
    assert [g.end for g in chunk.groups] == [TrailPosition(7, 7), TrailPosition(7, 12), TrailPosition(7, 13)]
    assert chunk.groups[0].log_csn == Csn(30, 1, 1, 3) and chunk.groups[0].cmplt_xids == ["T3"]
    # The truncating group: the insert before the TRUNCATE, the TRUNCATE, then the rest.
    units = chunk.groups[1].units
    assert [table for _, table in units] == [None, "shop.cart_sessions", None]
    assert len({unit for unit, _ in units}) == 3
    assert chunk.groups[1].operations == 5 and chunk.end == TrailPosition(7, 13)
    with pytest.raises(trail.TrailError, match="not the start of a transaction"):
        plan_chunk([TrailFile(7, "lt000000007", len(records), "")], [records.slice(1)], None, grouptransops=4)


@pytest.mark.parametrize("parts", [None, (5, 12)], ids=["whole files", "row groups"])
def test_a_file_is_cut_into_chunks_at_transaction_ends(parts):
    """Chunks are consecutive rba ranges of the files, from the start position to the end,
    each ending at the first transaction end at which it holds its size (the first's,
    then twice the last's up to the most), or at a file's end; each file is read once.
    Read in parts (row groups) whose ends fall inside transactions, the chunks are the same."""
    ins_ = ("INSERT", "shop.orders")
    first_file = _trail_table([[ins_] * 3, [ins_], [ins_] * 4, [ins_] * 2, [ins_], [ins_] * 5, [ins_] * 2])
    second_file = _trail_table([[ins_] * 2, [ins_] * 3])
    files = [TrailFile(7, "lt000000007", len(first_file), ""), TrailFile(8, "lt000000008", len(second_file), "")]
    read = []

    def reader(file):
        read.append(file.seqno)
        table = {7: first_file, 8: second_file}[file.seqno]
        if parts is None:
            return [table]
        # rbas 0-4, 5-11, 12-: transactions T3 (rbas 4-7) and T6 (11-15) span two parts.
        bounds = [0, *parts, len(table)]
        return [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:]) if b > a]

    def rbas(files_, tables):
        merged = []
        for f, t in zip(files_, tables):
            if merged and merged[-1][0] == f.seqno:
                merged[-1][1].extend(t.column("rba").to_pylist())
            else:
                merged.append((f.seqno, t.column("rba").to_pylist()))
        return merged

    chunks = [rbas(fs, ts) for fs, ts, piece in cut(files, reader, 3, first=2, most=5) if piece is None]
    # From rba 3 (T2): T2 holds 1 record < 2, with T3 5 >= 2: [3..7]. Then 4: T4 and T5
    # hold 3 < 4, and with T6 they would hold 8, more than the most (5): [8..10], then T6
    # [11..15]. Then 5: T7 ends file 7 at 2 records, so the chunk goes on into file 8 (a
    # file's end ends a chunk only once it is full), up to the most: T8, then T9.
    assert chunks == [[(7, [3, 4, 5, 6, 7])], [(7, [8, 9, 10])], [(7, [11, 12, 13, 14, 15])],
                      [(7, [16, 17]), (8, [0, 1])], [(8, [2, 3, 4])]]
    assert read == [7, 8]
    planned = [plan_chunk(fs, ts, None, grouptransops=100) for fs, ts, _ in cut(files, reader, 3, first=2, most=5)]
    # A chunk's end is the position after its last transaction: the next one starts there.
    assert [c.end for c in planned] == [TrailPosition(7, 8), TrailPosition(7, 11), TrailPosition(7, 16),
                                        TrailPosition(8, 2), TrailPosition(8, 5)]
    assert [c.groups[-1].end for c in planned] == [c.end for c in planned]


@pytest.mark.parametrize("parts", [None, (3, 9, 13)], ids=["whole file", "row groups"])
def test_a_transaction_longer_than_a_chunk_comes_in_pieces(parts):
    """A chunk holds at most `most` records: a transaction longer than that comes as
    pieces of `most` records, the last ending at its end, each planned as that one
    transaction, its group ending where the piece does; the chunks around it hold whole
    transactions. Skipped (at or below log_csn), it counts once, at its last piece."""
    ins_ = ("INSERT", "shop.orders")
    table = _trail_table([[ins_] * 2, [ins_] * 12, [ins_]])
    file = TrailFile(7, "lt000000007", len(table), "")

    def reader(_):
        if parts is None:
            return [table]
        bounds = [0, *parts, len(table)]
        return [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]

    cuts = list(cut([file], reader, 0, first=2, most=5))
    assert [(sum((t.column("rba").to_pylist() for t in ts), []), piece) for _, ts, piece in cuts] == [
        ([0, 1], None), ([2, 3, 4, 5, 6], Piece(0, last=False)), ([7, 8, 9, 10, 11], Piece(1, last=False)),
        ([12, 13], Piece(2, last=True)), ([14], None)]
    planned = [plan_chunk(fs, ts, None, grouptransops=100, piece=piece) for fs, ts, piece in cuts]
    assert [[g.end for g in c.groups] for c in planned] == [
        [TrailPosition(7, 2)], [TrailPosition(7, 7)], [TrailPosition(7, 12)], [TrailPosition(7, 14)],
        [TrailPosition(7, 15)]]
    assert {c.groups[0].log_xid for c in planned[1:4]} == {"T2"}
    assert [c.groups[0].operations for c in planned[1:4]] == [5, 5, 2]
    skipped = [plan_chunk(fs, ts, Csn(20, 1, 1, 2), grouptransops=100, piece=piece) for fs, ts, piece in cuts]
    assert [len(c.groups) for c in skipped] == [0, 0, 0, 0, 1] and [c.skipped for c in skipped] == [1, 0, 0, 1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_transactions_are_grouped_as_grouptransops_says(seed):
    """Groups follow GROUPTRANSOPS transaction by transaction: skipped ones belong to no
    group, a group closes once it holds GROUPTRANSOPS operations, a TRUNCATE starts a new
    one, a load window's high watermark ends its own. Checked on random transactions
    against that rule written as a loop over every transaction."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    ops = rng.integers(1, 12, n)
    skip = rng.random(n) < (0.3 if seed % 2 else 0.0)
    truncates = rng.random(n) < (0.05 if seed % 3 else 0.0)
    ends = rng.random(n) < (0.05 if seed % 4 else 0.0)
    grouptransops = int(rng.choice([1, 3, 10, 40]))
    expected, group, size = [], -1, 0
    for count, skipped, truncating, ending in zip(ops.tolist(), skip, truncates, ends):
        if skipped:
            expected.append(-1)
            continue
        if group < 0 or size >= grouptransops or (truncating and size):
            group, size = group + 1, 0
        expected.append(group)
        size = grouptransops if ending else size + count
    assert group_transactions(ops, skip, truncates, ends, grouptransops).tolist() == expected


def test_replicat_options_are_validated_and_named(tmp_path):
    base = "sources:\n  SRC:\n    altarchivelogdest: a\nreplicats:\n  REP1:\n    exttrail: dirdat/lt\n"
    for options, complaint in [("    source: SRC\n    groupstransops: 5\n", "replicats.REP1.groupstransops: unknown option"),
                               ("    source: NOPE\n", "replicat REP1 reads source 'NOPE', which is not configured"),
                               ("    source: SRC\n    map: [{source: shop, target: x.y}]\n", "must be schema.table"),
                               ("    source: SRC\n    map: [{source: shop.*, target: 'x.y*'}]\n",
                                "a wildcard stands for a whole schema or table name"),
                               ("    source: SRC\n    grouptransops: 0\n", "replicats.REP1.grouptransops")]:
        path = tmp_path / "trailbound.yaml"
        path.write_text(base + options)
        with pytest.raises(configuration.ConfigError, match=complaint.replace("*", "\\*").replace("(", "\\(")):
            configuration.load(path)
    assert tgt.map_name([configuration.MapRule(source="hr.*", target="x.*"),
                         configuration.MapRule(source="shop.*", target="Copy.*")], 'shop.Kunden "Prüfung"') == \
        ("Copy", 'Kunden "Prüfung"')
    assert tgt.map_name(tgt.IDENTITY, "shop.orders") == ("shop", "orders")
    assert tgt.map_name([configuration.MapRule(source="hr.*", target="x.*")], "shop.orders") is None


# ---------------------------------------------------------------- net change (Spark)

def _net(spark, records, shapes):
    frame = spark.createDataFrame(records, "unit long, seq long, table string, op string, before string, "
                                           "after string")
    return sorted((r["unit"], r["table"], r["kind"], tuple(r["okey"] or ()), tuple(sorted((r["vals"] or {}).items())))
                  for r in net_rows(frame, shapes))


def J(image):  # noqa: N802
    return json.dumps(image) if image is not None else None


def test_net_change_per_key(spark):
    shapes = {"s.t": Shape.of(["id", "a", "b"], ["id"]), "s.k": Shape.of(["x", "y"], [])}
    records = [
        (1, 1, "s.t", "INSERT", None, J({"id": 1, "a": "x", "b": None})),       # inserted, updated, deleted:
        (1, 2, "s.t", "UPDATE", J({"id": 1}), J({"id": 1, "a": "y"})),          # nothing left
        (1, 3, "s.t", "DELETE", J({"id": 1}), None),
        (1, 4, "s.t", "UPDATE", J({"id": 5}), J({"id": 5, "b": None})),         # in place; b present (NULL)
        (1, 5, "s.t", "UPDATE", J({"id": 5}), J({"id": 5, "a": ""})),           # and a (empty string)
        (1, 6, "s.t", "UPDATE", J({"id": 6}), J({"id": 7, "a": "moved"})),      # key update 6 -> 7 -> 8
        (1, 7, "s.t", "UPDATE", J({"id": 7}), J({"id": 8})),
        (1, 8, "s.t", "INSERT", None, J({"id": 6, "a": "new", "b": "6"})),      # a new row takes key 6
        (1, 9, "s.t", "DELETE", J({"id": 9}), None),
        (1, 10, "s.t", "INSERT", None, J({"id": 20, "a": "i", "b": "j"})),      # inserted, then its key updated
        (1, 11, "s.t", "UPDATE", J({"id": 20}), J({"id": 21, "b": "k"})),
        (1, 12, "s.t", "DELETE", J({"id": 30}), None),                         # deleted, inserted again
        (1, 13, "s.t", "INSERT", None, J({"id": 30, "a": "again", "b": None})),
        (2, 14, "s.t", "INSERT", None, J({"id": 1, "a": "unit 2", "b": None})),  # another unit: its own net change
        (2, 15, "s.k", "UPDATE", J({"x": "1", "y": None}), J({"x": "1", "y": "2"})),  # keyless: by all columns
        (2, 16, "s.k", "DELETE", J({"x": "3", "y": None}), None),
    ]
    assert _net(spark, records, shapes) == sorted([
        (1, "s.t", "U", ("5",), (("a", ""), ("b", None), ("id", "5"))),
        (1, "s.t", "M", ("6",), (("a", "moved"), ("id", "8"))),
        (1, "s.t", "I", (), (("a", "new"), ("b", "6"), ("id", "6"))),
        (1, "s.t", "D", ("9",), ()),
        (1, "s.t", "I", (), (("a", "i"), ("b", "k"), ("id", "21"))),
        (1, "s.t", "D", ("30",), ()),
        (1, "s.t", "I", (), (("a", "again"), ("b", None), ("id", "30"))),
        (2, "s.t", "I", (), (("a", "unit 2"), ("b", None), ("id", "1"))),
        (2, "s.k", "M", ("1", None), (("x", "1"), ("y", "2"))),
        (2, "s.k", "D", ("3", None), ()),
    ])


def test_copy_lines_escape_values_and_carry_the_mask(spark):
    shapes = {"s.t": Shape.of(["id", "a", "b"], ["id"])}
    awkward = "tab\there\nnew\\line\r \\N"
    records = [(1, 1, "s.t", "INSERT", None, J({"id": 1, "a": awkward, "b": ""})),
               (1, 2, "s.t", "INSERT", None, J({"id": 2, "a": None, "b": "Zoë 🚀"})),
               (1, 3, "s.t", "UPDATE", J({"id": 3}), J({"id": 3, "b": None})),
               (1, 4, "s.t", "DELETE", J({"id": 4}), None)]
    frame = spark.createDataFrame(records, "unit long, seq long, table string, op string, before string, after string")
    lines = {(r.kind, r.line) for r in copy_lines(net_changes(frame, shapes), shapes).collect()}
    assert lines == {("I", "1\ttab\\there\\nnew\\\\line\\r \\\\N\t\n"),
                     ("I", "2\t\\N\tZoë 🚀\n"),
                     ("U", "U\t101\t3\t3\t\\N\t\\N\n"),
                     ("D", "D\t000\t4\t\\N\t\\N\t\\N\n")}
    # Rows resolved on the driver (key updates) are formatted the same way.
    assert format_line({"kind": "I", "okey": None, "vals": {"id": "1", "a": awkward, "b": ""}},
                       shapes["s.t"]) == "1\ttab\\there\\nnew\\\\line\\r \\\\N\t\n"
    assert format_line({"kind": "U", "okey": ["3"], "vals": {"id": "3", "b": None}},
                       shapes["s.t"]) == "U\t101\t3\t3\t\\N\t\\N\n"


def _plan(source: str, columns: dict[str, str], key: list[str]) -> tgt.TablePlan:
    schema, name = source.split(".")
    return tgt.TablePlan(source, schema, name, tuple(columns), tuple(columns.values()), (False,) * len(columns),
                         tuple(key) or tuple(columns), not key)


def test_the_arrow_net_change_writes_sparks_lines_and_leaves_key_changes_to_it(spark):
    """net/arrow.py (vectorised, no JVM) and the Spark transform agree line for line on every
    (unit, table) without a key change; those with one are left to Spark. (Floats whose
    spelling differs, 1e-300 against Java's 1.0E-300, are left out: PostgreSQL reads
    both as the same double; test_awkward_values... carries such values to a target.)"""
    plans = {"s.t": _plan("s.t", {"id": "bigint", "a": "text", "b": "text", "n": "double precision",
                                  'we"ird naïve': "boolean"}, ["id"]),
             "s.k": _plan("s.k", {"x": "text", "y": "text"}, [])}
    shapes = {name: Shape.of(plan.columns, plan.key) for name, plan in plans.items()}
    odd = 'we"ird naïve'
    records = [
        (1, 1, "s.t", "INSERT", None, J({"id": 1, "a": "x", "b": None, "n": 1.5})),  # inserted, updated, deleted
        (1, 2, "s.t", "UPDATE", J({"id": 1}), J({"id": 1, "a": "y"})),
        (1, 3, "s.t", "DELETE", J({"id": 1}), None),
        (1, 4, "s.t", "UPDATE", J({"id": 5}), J({"id": 5, "b": None})),              # b present (NULL), a absent
        (1, 5, "s.t", "UPDATE", J({"id": 5}), json.dumps({"id": 5, odd: True}, ensure_ascii=True)),
        (1, 6, "s.t", "UPDATE", J({"id": 6}), '{"id" : 6, "a": "\\"b\\": not a key", "n": -2.5}'),
        (1, 7, "s.t", "DELETE", J({"id": 30}), None),                                # deleted, inserted again
        (1, 8, "s.t", "INSERT", None, J({"id": 30, "a": "tab\there\nnew\\line", "b": "", odd: False})),
        (1, 9, "s.t", "UPDATE", J({"id": 30}), J({"id": 30, "b": "Zoë 🚀"})),
        (1, 10, "s.k", "DELETE", J({"x": "3", "y": None}), None),                    # keyless: by all columns
        (1, 11, "s.k", "INSERT", None, J({"x": "4", "y": "\\N"})),
        (2, 12, "s.t", "UPDATE", J({"id": 6}), J({"id": 7, "a": "moved"})),          # a key update: Spark's
        (2, 13, "s.t", "INSERT", None, J({"id": 6, "a": "new"})),
        (2, 14, "s.k", "UPDATE", J({"x": "1", "y": None}), J({"x": "1", "y": "2"})),  # keyless update moves it
        (2, 15, "s.k", "INSERT", None, J({"x": "5", "y": None})),
        (3, 16, "s.t", "UPDATE", J({"id": 5}), J({"id": 5, "a": "unit 3"})),
    ]
    data = pa.Table.from_pylist([dict(zip(netarrow.RECORDS_SCHEMA.names, r)) for r in records],
                                schema=netarrow.RECORDS_SCHEMA)
    lines, left = netarrow.net_lines(data, plans)
    assert sorted({(r[0], r[2]) for r, spark_s in zip(records, left) if spark_s}) == [(2, "s.k"), (2, "s.t")]
    frame = spark.createDataFrame(records, "unit long, seq long, table string, op string, before string, after string")
    expected = {(r.unit, r.table, r.kind, r.step, r.line) for r in copy_lines(net_changes(frame, shapes), shapes)
                .collect() if r.unit != 2}
    assert {tuple(r.values()) for r in lines.to_pylist()} == expected
    assert ("s.t", "U", "U\t10101\t5\t5\t\\N\t\\N\t\\N\ttrue\n") in {(t, k, line) for _, t, k, _, line in expected}
    assert len(lines) == len(expected) == 7


def test_tables_of_one_layout_netted_in_one_pass_get_the_lines_each_gets_alone():
    """net/arrow.py nets the tables whose plans agree (columns, types, key) in one pass,
    the (unit, table) in place of the unit: each table gets exactly the lines, and the
    same records left to the key-change backends, as when it is netted alone; every
    (unit, table, step) stays contiguous. Also when one table's image does not parse
    (that table alone is left) and for inserts the trail carries as COPY lines."""
    import pyarrow.compute as pc

    from trailbound import copytext

    columns = {"id": "bigint", "a": "text", "n": "double precision", "f": "boolean"}
    plans = {name: _plan(name, columns, ["id"]) for name in ("s.t", "s.u", "s.v")}
    plans |= {name: _plan(name, {"x": "text", "y": "text"}, []) for name in ("s.k", "s.l")}
    records = []
    for number, (keyed, keyless) in enumerate((("s.t", "s.k"), ("s.u", "s.l"), ("s.v", "s.k"))):
        for unit, _, table, op, before, after in _key_changing_work(number + 1, units=12):
            records.append([unit, table == "s.t" and keyed or keyless, op, before, after])
    for unit in (13, 14):  # insert-only units: a key repeated in s.u's unit 14 only
        for table in ("s.t", "s.u", "s.v"):
            for key in (1, 2, 1 if (unit, table) == (14, "s.u") else 3):
                records.append([unit, table, "INSERT", None, J({"id": key, "a": f"{table} {unit}", "f": True})])
    records.append([15, "s.v", "INSERT", None, J({"id": "not a number"})])  # s.v's images do not parse
    records.append([15, "s.t", "INSERT", None, J({"id": 99})])
    records.sort(key=lambda r: r[0])  # units ascend along the trail; tables interleave inside them
    data = pa.Table.from_pylist([dict(zip(netarrow.RECORDS_SCHEMA.names, [r[0], seq, *r[1:]]))
                                 for seq, r in enumerate(records)], schema=netarrow.RECORDS_SCHEMA)
    lined = []
    for r in records:
        plan = plans[r[1]]
        parsed = copytext.parse_images(pa.array([r[4]]), plan.columns, plan.types) if r[2] == "INSERT" else None
        lined.append(copytext.copy_lines([copytext.copy_values(parsed.column(c)) for c in plan.columns])[0].as_py()
                     if parsed is not None else None)
    for part in (data, data.append_column("copy_line", pa.array(lined, pa.string()))):
        together, left = netarrow.net_lines(part, plans)
        runs = [(u, t, s) for u, t, s in zip(*(together.column(c).to_pylist() for c in ("unit", "table", "step")))]
        cuts = [run for i, run in enumerate(runs) if i == 0 or run != runs[i - 1]]
        assert len(cuts) == len(set(cuts)), "each (unit, table, step) contiguous"
        for name in plans:
            mine = pc.equal(part.column("table"), name)
            alone, alone_left = netarrow.net_lines(part.filter(mine), plans)
            netted = together.filter(pc.equal(together.column("table"), name))
            assert sorted(tuple(r.values()) for r in netted.to_pylist()) == \
                sorted(tuple(r.values()) for r in alone.to_pylist()), name
            assert left[np.asarray(mine)].tolist() == alone_left.tolist(), name
        assert left[[i for i, r in enumerate(records) if r[1] == "s.v" and r[0] == 15]].all()
        assert not left[[i for i, r in enumerate(records) if r[0] == 15 and r[1] == "s.t"]].any()
        assert left.any() and not left.all(), "key changes left, the rest netted"


def _key_changing_work(seed: int, units: int = 40) -> list[tuple]:
    """Records a source could write: rows that keep or change their keys (chains, keys
    reused after a DELETE or a move), partial UPDATE images, JSON numbers and booleans,
    NULLs; and a keyless table whose rows hold NULLs."""
    import random

    rng = random.Random(seed)
    live = {k: {"id": k, "a": f"a{k}"} for k in range(1, 9)}  # rows the target holds already
    records, seq = [], 0
    for unit in range(1, units + 1):
        for _ in range(rng.randrange(1, 12)):
            seq += 1
            roll = rng.random()
            free = [k for k in range(1, 60) if k not in live]
            if roll < 0.25 or not live:
                key = rng.choice(free)
                live[key] = {"id": key, "a": rng.choice(["x", None, "tab\there"]), "n": rng.randrange(-5, 5),
                             "f": rng.random() < 0.5}
                records.append((unit, seq, "s.t", "INSERT", None, J(live[key])))
            elif roll < 0.4:
                key = rng.choice(sorted(live))
                del live[key]
                records.append((unit, seq, "s.t", "DELETE", J({"id": key}), None))
            else:
                key = rng.choice(sorted(live))
                after = {c: v for c, v in (("a", rng.choice(["y", None, "Zoë"])), ("n", rng.random()),
                                           ("f", rng.random() < 0.5)) if rng.random() < 0.5}
                if roll < 0.7:  # a key change
                    row = live.pop(key)
                    after["id"] = rng.choice(free)
                    live[after["id"]] = row | after
                elif rng.random() < 0.5:
                    after["id"] = key  # an in-place UPDATE names its key, or leaves it out
                records.append((unit, seq, "s.t", "UPDATE", J({"id": key}), J(after)))
            if rng.random() < 0.2:
                seq += 1
                x, y = rng.choice(["1", "2"]), rng.choice(["3", None])
                op = rng.choice(["INSERT", "DELETE", "UPDATE"])
                records.append((unit, seq, "s.k", op, None if op == "INSERT" else J({"x": x, "y": y}),
                                None if op == "DELETE" else J({"x": x, "y": rng.choice(["3", None])})))
    return records


def test_the_python_net_change_writes_sparks_lines(spark):
    """net/python.py (the key-changing (unit, table)s of a chunk, without a JVM) and the
    Spark transform give the same lines, chains resolved the same way: the per-key
    cases above, and random work full of key changes (3 seeds, about 700 records)."""
    from trailbound.replicat.net import python as netpython

    shapes = {"s.t": Shape.of(["id", "a", "n", "f"], ["id"]), "s.k": Shape.of(["x", "y"], [])}
    per_key = [(1, 1, "s.t", "INSERT", None, J({"id": 1, "a": "x", "n": None})),
               (1, 2, "s.t", "UPDATE", J({"id": 6}), J({"id": 7, "a": "moved", "n": 7})),   # 6 -> 7 -> 8
               (1, 3, "s.t", "UPDATE", J({"id": 7}), J({"id": 8, "f": True})),
               (1, 4, "s.t", "INSERT", None, J({"id": 6, "a": "new", "f": False})),         # a new row at 6
               (1, 5, "s.t", "UPDATE", J({"id": 1}), J({"id": 21, "n": -2})),               # inserted, moved
               (1, 6, "s.t", "UPDATE", J({"id": 30}), J({"a": "key left out", "n": 1.5})),  # in place
               (1, 7, "s.t", "UPDATE", J({"id": 40}), J({"id": 41})),                       # moved, then
               (1, 8, "s.t", "DELETE", J({"id": 41}), None),                                # deleted
               (2, 9, "s.t", "UPDATE", J({"id": 50}), J({"id": 51, "a": "unit 2"})),
               (2, 10, "s.k", "UPDATE", J({"x": "1", "y": None}), J({"x": "1", "y": None})),
               (2, 11, "s.k", "UPDATE", J({"x": "1", "y": "3"}), J({"x": "1", "y": "3"}))]
    for records in (per_key, *(_key_changing_work(seed) for seed in (1, 2, 3))):
        frame = spark.createDataFrame(records, "unit long, seq long, table string, op string, before string, "
                                               "after string")
        expected = sorted((r["unit"], r["table"], r["kind"], format_line(r, shapes[r["table"]]))
                          for r in net_rows(frame, shapes))
        python = netpython.net_lines([dict(zip(netarrow.RECORDS_SCHEMA.names, r)) for r in records], shapes)
        assert sorted(zip(*(python.column(c).to_pylist() for c in ("unit", "table", "kind", "line")))) == expected
        assert "M" in {kind for _, _, kind, _ in expected}, "key changes were netted"


KUNDEN = 'shop.Kunden "Prüfung"'
AWKWARD_TABLES = [
    {"name": KUNDEN, "key": ["Kunden-Nr"], "columns": [
        {"name": "Kunden-Nr", "type": "bigint", "nullable": False}, {"name": "select", "type": "text", "nullable": True},
        {"name": "Mixed Case", "type": "text", "nullable": True}, {"name": "naïve", "type": "boolean", "nullable": True},
        {"name": "from", "type": "date", "nullable": True}, {"name": "payload", "type": "bytea", "nullable": True},
        {"name": "score", "type": "double precision", "nullable": True},
        {"name": "tags", "type": "text[]", "nullable": True}, {"name": "big", "type": "bigint", "nullable": True}]},
    {"name": "shop.orders", "key": ["id"], "columns": [
        {"name": "id", "type": "bigint", "nullable": False}, {"name": "total", "type": "numeric", "nullable": False},
        {"name": "at", "type": "timestamptz", "nullable": True}, {"name": "items", "type": "integer[]", "nullable": True},
        {"name": "meta", "type": "jsonb", "nullable": True}]},
]


@pytest.mark.parametrize("key_changes", ["Python", "Spark"])
def test_awkward_values_through_every_path_reach_the_target_exactly(tmp_path, spark, store, target_dsn, monkeypatch,
                                                                     key_changes):
    """An insert-only unit and a mixed unit (netted with Arrow) and a key update (netted
    in Python, or by Spark when a chunk holds more of them than net.python.LIMIT: here 0)
    carry every awkward value to the target: NULL vs '', escapes, Unicode, numeric
    scale, bytea, arrays, jsonb, float extremes."""
    from trailbound.replicat.net import python as netpython

    if key_changes == "Spark":
        monkeypatch.setattr(netpython, "LIMIT", 0)
    from capture_kit import Archive
    from trailbound.archive.writer import write_defs

    root = tmp_path / "archive"
    write_defs(root, AWKWARD_TABLES)
    archive = Archive(root)
    k1 = {"Kunden-Nr": 1, "select": "tab\there \\N back\\slash", "Mixed Case": "", "naïve": True,
          "from": "2026-11-01", "payload": "\\x00ff", "score": -0.0, "tags": '{"a b",NULL}',
          "big": 9223372036854775807}
    k2 = {"Kunden-Nr": 2, "select": None, "Mixed Case": "Zoë 🚀 北京", "naïve": None, "from": None, "payload": None,
          "score": 1e-300, "tags": "{}", "big": -9223372036854775808}
    k3 = {"Kunden-Nr": 3, "select": "line\nbreak\r", "Mixed Case": None, "naïve": False, "from": "1999-12-31",
          "payload": "\\x", "score": 6.02214076e23, "tags": None, "big": 0}
    k5 = {"Kunden-Nr": 5, "select": "'; DROP TABLE x; --", "Mixed Case": "NULL", "naïve": True, "from": None,
          "payload": "\\xdeadbeef", "score": 1.7976931348623157e308, "tags": '{"with \\"quote\\""}', "big": None}
    o1 = {"id": 1, "total": "12345.678901234567890", "at": "2026-11-01 12:00:00.123456+00", "items": "{1,NULL}",
          "meta": '{"n": 1.50, "x": "naïve \\"q\\""}'}
    o2 = {"id": 2, "total": "0.10", "at": None, "items": "{}", "meta": None}

    def change(scn, xid, op, table=None, before=None, after=None):
        return {"scn": scn, "ts": at(scn), "xid": xid, "parent_xid": None, "op": op, "table": table,
                "before": before, "after": after}

    archive.segment(1, [
        change(10, "T1", "INSERT", KUNDEN, after=k1), change(11, "T1", "INSERT", KUNDEN, after=k2),
        change(12, "T1", "INSERT", KUNDEN, after=k3), change(13, "T1", "INSERT", "shop.orders", after=o1),
        change(14, "T1", "INSERT", "shop.orders", after=o2), change(15, "T1", "COMMIT"),
        change(20, "T2", "UPDATE", "shop.orders", {"id": 2}, {"id": 2, "total": "7.000"}),
        change(21, "T2", "UPDATE", KUNDEN, {"Kunden-Nr": 1}, {"Kunden-Nr": 1, "score": 2.5, "Mixed Case": None}),
        change(22, "T2", "DELETE", KUNDEN, {"Kunden-Nr": 2}),
        change(23, "T2", "INSERT", KUNDEN, after=k5), change(24, "T2", "COMMIT"),
        change(30, "T3", "UPDATE", KUNDEN, {"Kunden-Nr": 3}, {"Kunden-Nr": 30, "select": "moved"}),
        change(31, "T3", "COMMIT"),
        # In one unit, an update whose image carries every column (set without a choice
        # per column) beside one that leaves columns out (the target keeps them).
        change(40, "T4", "UPDATE", "shop.orders", {"id": 1}, o1 | {"total": "98765.432100000000000", "items": None}),
        change(41, "T4", "UPDATE", KUNDEN, {"Kunden-Nr": 5}, {"Kunden-Nr": 5, "big": 7}),
        change(42, "T4", "COMMIT")], 100)
    config = configuration.load(write_config(tmp_path, tables=("shop.*",), grouptransops=3))
    run_extract(spark, store, config, "EXT1")
    _create_target(config, target_dsn)
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (result.groups, result.replayed_groups) == (3, 0)
    assert {"prepare: net change (Arrow)", "prepare: net change (Spark)" if key_changes == "Spark" else
            "prepare: net change (key changes, Python)"} <= set(result.timings)
    names = lambda table: [c["name"] for c in table["columns"]]  # noqa: E731
    truth = {"tables": {
        KUNDEN: {"columns": names(AWKWARD_TABLES[0]),
                 "rows": [k1 | {"score": 2.5, "Mixed Case": None}, k3 | {"Kunden-Nr": 30, "select": "moved"},
                          k5 | {"big": 7}]},
        "shop.orders": {"columns": names(AWKWARD_TABLES[1]),
                        "rows": [o1 | {"total": "98765.432100000000000", "items": None}, o2 | {"total": "7.000"}]}}}
    assert differences(target_dsn, truth) == {}
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT total::text FROM shop.orders ORDER BY id")
        assert [r[0] for r in cur.fetchall()] == ["98765.432100000000000", "7.000"], "numeric scale is kept"


def test_the_cli_starts_spark_only_for_a_run_that_needs_it(tmp_path, spark, metadata_dsn, store, target_dsn):
    """`replicat run` applies a local trail of plain inserts, updates and deletes in a
    process that cannot start a JVM (JAVA_HOME points nowhere): the common run pays for
    no Spark session, and neither does one with a few key-changing UPDATEs (netted in
    Python: net/python.py). Spark is asked for only past net.python.LIMIT such records in
    a chunk, which test_awkward_values... drives in process."""
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), ins(11, "T1", 2), ins(12, "T1", 3), rec(13, "T1", "COMMIT"),
                        rec(20, "T2", "UPDATE", "shop.orders", key=2, note="changed"),
                        rec(21, "T2", "DELETE", "shop.orders", key=3), rec(22, "T2", "COMMIT")], 100)
    config_path = write_config(tmp_path, tables=("shop.*",))
    config = configuration.load(config_path)
    run_extract(spark, store, config, "EXT1")
    _create_target(config, target_dsn)
    env = {**os.environ, "TRAILBOUND_METADATA_DSN": metadata_dsn, "TRAILBOUND_TARGET_DSN": target_dsn}
    no_java = {**env, "JAVA_HOME": str(tmp_path / "no-java")}
    replicat = [sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "replicat", "run", "REP1"]

    def orders():
        with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
            cur.execute("SELECT id, note FROM shop.orders ORDER BY id")
            return cur.fetchall()

    done = subprocess.run(replicat, env=no_java, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "applied 2 transactions (5 records)" in done.stdout, done.stdout
    assert orders() == [(1, "n1"), (2, "changed")]
    applied = checkpoint_row(target_dsn)

    key_update = {"scn": 110, "ts": at(110), "xid": "T3", "parent_xid": None, "op": "UPDATE", "table": "shop.orders",
                  "before": {"id": 1}, "after": {"id": 10, "note": "moved"}}
    archive.segment(1, [key_update, rec(111, "T3", "COMMIT")], 200)
    run_extract(spark, store, config, "EXT1")
    done = subprocess.run(replicat, env=no_java, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert orders() == [(2, "changed"), (10, "moved")] and checkpoint_row(target_dsn) != applied
    started = subprocess.run([sys.executable, "-c", "from trailbound import spark; spark.session('x').stop()"],
                             env=no_java, capture_output=True, text=True, timeout=300)
    assert started.returncode != 0, "this process cannot start Spark, so the runs above mean something"


@pytest.mark.long_running(100)
def test_a_keyless_tables_records_are_replayed_inside_a_group_applied_as_a_set(tmp_path, spark, store, target_dsn,
                                                                               caplog):
    """A keyless table (REPLICA IDENTITY FULL) may hold identical rows: three identical
    INSERTs leave three rows, a DELETE of one leaves the others, an UPDATE moves one of
    them (a net change keyed by all columns would fold or hit them all). So a group
    holding such changes applies its other tables as a set and replays only the keyless
    table's records, one statement each, in the same target transaction: the replica
    equals the source, and the group is not replayed whole. A keyless row missing on
    the target sends its group to the whole replay, which names the record; nothing of
    that group is applied until the row is there."""
    from capture_kit import Archive
    from trailbound.archive.writer import write_defs

    root = tmp_path / "archive"
    write_defs(root, [{"name": "shop.log", "key": [], "columns": [
        {"name": "who", "type": "text", "nullable": True}, {"name": "n", "type": "integer", "nullable": True}]},
        {"name": "shop.orders", "key": ["id"], "columns": [
            {"name": "id", "type": "integer", "nullable": False}, {"name": "note", "type": "text", "nullable": True}]}])

    def log(scn, xid, op, before=None, after=None):
        return {"scn": scn, "ts": at(scn), "xid": xid, "parent_xid": None, "op": op, "table": "shop.log",
                "before": before, "after": after}

    ann, bob, zed = {"who": "ann", "n": 1}, {"who": "bob", "n": 3}, {"who": "zed", "n": 9}
    Archive(root).segment(1, [
        ins(10, "T1", 1), ins(11, "T1", 2), *(log(12 + i, "T1", "INSERT", after=ann) for i in range(3)),
        rec(15, "T1", "COMMIT"),
        log(20, "T2", "DELETE", before=ann), rec(21, "T2", "UPDATE", "shop.orders", key=1, note="changed"),
        log(22, "T2", "INSERT", after=bob), rec(23, "T2", "COMMIT"),
        log(30, "T3", "UPDATE", ann, {"who": "ann", "n": 2}), rec(31, "T3", "DELETE", "shop.orders", key=2),
        rec(32, "T3", "COMMIT"),
        # Its own group: a DELETE of a keyless row the target lacks, beside another table's insert.
        ins(40, "T4", 7), log(41, "T4", "DELETE", before=zed), rec(42, "T4", "COMMIT")], 100)
    # T1..T3 hold 10 records: one group; T4 the next.
    config = configuration.load(write_config(tmp_path, tables=("shop.*",), grouptransops=10))
    run_extract(spark, store, config, "EXT1")
    _create_target(config, target_dsn)

    def rows():
        with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
            cur.execute("SELECT who, n FROM shop.log ORDER BY who, n")
            found = cur.fetchall()
            cur.execute("SELECT id, note FROM shop.orders ORDER BY id")
            found = (found, cur.fetchall())
        connection.close()
        return found

    with pytest.raises(ApplyError) as refused:
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (refused.value.op, refused.value.table, refused.value.xid) == ("DELETE", "shop.log", "T4")
    assert "no row with this key" in str(refused.value)
    assert rows() == ([("ann", 1), ("ann", 2), ("bob", 3)], [(1, "changed")]), "T1..T3 applied, nothing of T4"
    whole = [r.getMessage() for r in caplog.records if "replayed transaction by transaction" in r.getMessage()]
    assert len(whole) == 1, f"only T4's group was replayed whole: {whole}"

    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("INSERT INTO shop.log VALUES ('zed', 9)")
    connection.close()
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (result.groups, result.replayed_groups, result.replayed_records) == (1, 0, 1), result.describe()
    assert rows() == ([("ann", 1), ("ann", 2), ("bob", 3)], [(1, "changed"), (7, "n7")])


# ---------------------------------------------------------------- a captured simulated source

@dataclass
class Captured:
    directory: Path
    metadata_dsn: str          # the template each test clones
    truth: dict
    middle_seqno: int          # a committed end part-way: tests hide the files after it
    last_seqno: int


def _admin(server_dsn: str):
    connection = psycopg2.connect(psycopg2.extensions.make_dsn(server_dsn, dbname="postgres"))
    connection.autocommit = True
    return connection


@pytest.fixture(scope="session")
def captured(tmp_path_factory, spark, pg_server_dsn, new_metadata_database):
    """A simulated busy source (every awkward type and identifier, savepoints, TRUNCATE,
    key updates, a keyless table) captured into small trail files. Tests move the trail's
    committed end back (hiding trail_file rows) to apply it in several runs.

    Once per test process, not per module: the long tests that use it are started first
    (conftest), so a worker runs them, then other files, then this file's other tests; a
    module-scoped capture was torn down and made again in between (three captures in a
    two-worker run instead of two). Nothing writes it: each test gets a metadata_copy."""
    from trailbound.sources.simulator import simulate

    directory = tmp_path_factory.mktemp("replicat")
    simulate(directory / "archive", directory / "truth.json", records=6000, hours=12, seed=5)
    config = configuration.load(write_config(directory, megabytes=0.1))
    dsn = new_metadata_database()
    with MetadataStore.open(dsn) as store:
        run_extract(spark, store, config, "EXT1")
        last = _committed_seqnos(store)[-1]
    assert last >= 6
    return Captured(directory, dsn, json.loads((directory / "truth.json").read_text()), last // 2, last)


def _committed_seqnos(store) -> list[int]:
    with store.transaction() as cur:
        cur.execute("SELECT seqno FROM trailbound.trail_file ORDER BY seqno")
        return [row["seqno"] for row in cur.fetchall()]


@pytest.fixture
def metadata_copy(captured, pg_server_dsn):
    """A copy of the captured metadata store for one test (the trail files are shared:
    replicat never writes them)."""
    name = f"tb_replicat_{os.getpid()}_{os.urandom(4).hex()}"
    admin = _admin(pg_server_dsn)
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(psycopg2.extensions.parse_dsn(captured.metadata_dsn)["dbname"])))
    yield psycopg2.extensions.make_dsn(pg_server_dsn, dbname=name)
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()


def _hide_files_after(metadata_dsn: str, seqno: int) -> None:
    """Move the trail's committed end back, as if capture had committed only so far."""
    with psycopg2.connect(metadata_dsn) as connection, connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS public.hidden_trail_file (LIKE trailbound.trail_file)")
        cur.execute("WITH moved AS (DELETE FROM trailbound.trail_file WHERE seqno > %s RETURNING *)"
                    " INSERT INTO public.hidden_trail_file SELECT * FROM moved", (seqno,))


def _unhide_files(metadata_dsn: str) -> None:
    with psycopg2.connect(metadata_dsn) as connection, connection.cursor() as cur:
        cur.execute("WITH moved AS (DELETE FROM public.hidden_trail_file RETURNING *)"
                    " INSERT INTO trailbound.trail_file SELECT * FROM moved")


def _trail_end(metadata_dsn: str, with_bsn: bool = False):
    with psycopg2.connect(metadata_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT seqno, records, last_csn, log_bsn FROM trailbound.trail_file ORDER BY seqno DESC LIMIT 1")
        seqno, records, last_csn, log_bsn = cur.fetchone()
    end = (TrailPosition(seqno, records), Csn.parse(last_csn))
    return (*end, log_bsn) if with_bsn else end


def _file_checkpoint(metadata_dsn: str) -> ckpt.Checkpoint:
    with MetadataStore.open(metadata_dsn) as store, store.transaction() as cur:
        return ckpt.load(cur, "REP1").checkpoint


def _create_target(config, target_dsn: str) -> None:
    connection = psycopg2.connect(target_dsn)
    with connection, connection.cursor() as cur:
        tgt.create_tables(cur, load_defs(config.archive_dir("SRC")), config.replicat("REP1").map)
    connection.close()


def test_replica_equals_the_truth_across_runs(captured, metadata_copy, target_dsn, tmp_path, capsys, monkeypatch):
    config_path = write_config(tmp_path, home=captured.directory, grouptransops=100, megabytes=0.1)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", metadata_copy)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    run = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    assert run("target", "create") == 0
    assert 'shop.Kunden "Prüfung"' in capsys.readouterr().out

    _hide_files_after(metadata_copy, captured.middle_seqno)
    assert run("replicat", "run", "REP1") == 0
    first = capsys.readouterr().out
    assert "from file checkpoint at seqno 0 rba 0" in first
    middle = checkpoint_row(target_dsn)
    assert middle["seqno"] == captured.middle_seqno
    _unhide_files(metadata_copy)

    assert run("replicat", "run", "REP1") == 0
    assert f"from checkpoint table at seqno {captured.middle_seqno} rba {middle['rba']}" in \
        capsys.readouterr().out
    assert differences(target_dsn, captured.truth) == {}

    end, last_csn, log_bsn = _trail_end(metadata_copy, with_bsn=True)
    row = checkpoint_row(target_dsn)
    assert (row["seqno"], row["rba"], row["log_csn"], row["log_cmplt_csn"]) == (end.seqno, end.rba, str(last_csn),
                                                                                str(last_csn))
    assert json.loads(row["log_cmplt_xids"]) and row["log_xid"] in json.loads(row["log_cmplt_xids"])
    assert row["log_bsn"] == str(log_bsn) and row["audit_ts"] is not None and row["group_key"] == 0
    assert _file_checkpoint(metadata_copy) == ckpt.Checkpoint(end, last_csn, Scn(int(row["log_bsn"])), row["audit_ts"])
    with psycopg2.connect(metadata_copy) as connection, connection.cursor() as cur:
        cur.execute("SELECT seqno, rba FROM trailbound.trail_reader WHERE reader_kind = 'replicat'"
                    " AND group_name = 'REP1'")
        assert cur.fetchone() == (end.seqno, end.rba)
    # The values a user relies on are really there (so the comparison above means something).
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT count(*) FILTER (WHERE email = ''), count(*) FILTER (WHERE email IS NULL)"
                    " FROM shop.customers")
        assert min(cur.fetchone()) > 0
        cur.execute('SELECT count(*) FROM shop."Kunden ""Prüfung""" WHERE payload IS NOT NULL AND "select" IS NOT NULL')
        assert cur.fetchone()[0] > 0

    assert run("replicat", "run", "REP1") == 0
    assert "nothing new in the trail" in capsys.readouterr().out
    assert run("info", "replicat", "rep1", "--showch", "2") == 0
    shown = capsys.readouterr().out
    for expected in ("checkpoint table (target)", "file checkpoint (metadata store)", "The two agree",
                     f"Log CSN                {str(last_csn):<34} {last_csn}", "Checkpoint history",
                     "Startup Checkpoint", "Status STOPPED"):
        assert expected in shown


def test_capture_pump_and_replicat_count_the_same_transactions_on_one_trail(tmp_path, spark, store, target_dsn):
    """A run's "wrote N transactions", the pump's and replicat's "applied N transactions"
    are one figure: the transactions in the trail. Capture reads transactions that touch
    only tables it does not capture (the simulator's hr stories; TABLE shop.* here): they
    write nothing, so they are not counted as written."""
    from trailbound.pump.run import run_pump
    from trailbound.replicat.run import run_replicat
    from trailbound.sources.simulator import simulate

    simulate(tmp_path / "archive", tmp_path / "truth.json", records=800, hours=2, seed=7, threads=1, segment_minutes=60)
    config_path = write_config(tmp_path, tables=("shop.*",))
    text = config_path.read_text().replace("replicats:\n  REP1:\n    exttrail: dirdat/lt",
                                           "replicats:\n  REP1:\n    exttrail: remote/rt")
    config_path.write_text(text + "pumps:\n  PMP1: {exttrail: dirdat/lt, rmttrail: remote/rt}\n")
    config = configuration.load(config_path)
    _create_target(config, target_dsn)

    captured = run_extract(spark, store, config, "EXT1")
    pumped = run_pump(None, store, config, "PMP1")
    applied = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    remote = sorted((tmp_path / "remote").glob("rt*"))
    in_trail = {xid for path in remote for xid in trail.read_file(path).column("xid").to_pylist()}
    assert len(in_trail) > 50
    assert (captured.transactions_written, pumped.transactions_written, applied.transactions) == (len(in_trail),) * 3
    assert captured.records_written == pumped.records_written == applied.operations
    n, records = len(in_trail), captured.records_written
    assert f"wrote {n} transactions ({records} records)" in captured.describe()
    assert f"wrote {n} transactions ({records} records)" in pumped.describe()
    assert f"applied {n} transactions ({records} records)" in applied.describe()


# ---------------------------------------------------------------- crashes

@pytest.mark.long_running(60)
def test_a_crash_at_every_point_in_turn_then_a_rerun_converges(captured, metadata_copy, target_dsn, tmp_path, spark,
                                                               crash_driver):
    """Replicat is killed at each crash point in turn, each kill in a run that first
    recovers from the kills before it; then one run converges."""
    config_path = write_config(tmp_path, home=captured.directory, grouptransops=300, megabytes=0.1)
    config = configuration.load(config_path)
    _create_target(config, target_dsn)
    env = {**os.environ, "TRAILBOUND_METADATA_DSN": metadata_copy, "TRAILBOUND_TARGET_DSN": target_dsn,
           **crash_driver.env}
    for point in ("mid_copy", "after_target_commit", "between_groups"):
        crashed = subprocess.run(crash_driver.cli("--config", str(config_path), "replicat", "run", "REP1"),
                                 env={**env, CRASH_ENV: point}, capture_output=True, text=True, timeout=300)
        assert crashed.returncode == 137, (point, crashed.stderr[-3000:])
        row, file_checkpoint = checkpoint_row(target_dsn), _file_checkpoint(metadata_copy)
        if point == "mid_copy":
            # The first COPY may come after groups replayed record by record (a keyless
            # table's changes are not staged): those are committed with their row, the
            # group that died in its COPY is not; the metadata store never runs ahead.
            assert row is None or file_checkpoint.position <= TrailPosition(row["seqno"], row["rba"]), \
                "the group that died in its COPY: nothing of it is committed"
        elif point == "after_target_commit":
            assert row["seqno"] >= 1 and file_checkpoint.position < TrailPosition(row["seqno"], row["rba"]), \
                "the target committed the group, the metadata store never heard of it"
            committed = TrailPosition(row["seqno"], row["rba"])
        else:
            # The file checkpoint follows the checkpoint table lazily (at most every
            # FILE_CHECKPOINT_SECONDS): never ahead of it, and the rerun starts from the table.
            assert committed < TrailPosition(row["seqno"], row["rba"]), "the run went on from the table's row"
            assert TrailPosition(0, 0) < file_checkpoint.position <= TrailPosition(row["seqno"], row["rba"])
    with MetadataStore.open(metadata_copy) as store:
        result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.started_from == "checkpoint table"
    assert differences(target_dsn, captured.truth) == {}
    end, last_csn = _trail_end(metadata_copy)
    assert _file_checkpoint(metadata_copy).position == end
    assert checkpoint_row(target_dsn)["log_csn"] == str(last_csn)


@pytest.mark.long_running(45)
def test_a_file_split_into_chunks_applies_once_across_a_crash_between_them(captured, metadata_copy, target_dsn,
                                                                            tmp_path, spark, crash_driver):
    """A trail file larger than GROUPTRANSOPS is applied in several chunks (rba ranges of
    the file, each ending at a transaction's end). The first chunk is one group here, so a
    kill after that group (between_groups) falls between two chunks of one file: the rerun
    starts inside the file, at the checkpoint table's rba, and applies the rest exactly
    once."""
    grouptransops = 40
    config_path = write_config(tmp_path, home=captured.directory, grouptransops=grouptransops, megabytes=0.1)
    config = configuration.load(config_path)
    _create_target(config, target_dsn)
    with MetadataStore.open(metadata_copy) as store, store.transaction() as cur:
        cur.execute("SELECT seqno, path, records, sha256 FROM trailbound.trail_file ORDER BY seqno LIMIT 1")
        first_file = TrailFile(**cur.fetchone())
    records = trail.read_file(first_file.path)
    pieces = cut([first_file], lambda f: [records], 0, first=grouptransops, most=10 * grouptransops)
    files, tables, _ = next(pieces)
    first_chunk = plan_chunk(files, tables, None, grouptransops)
    assert next(pieces, None) is not None, "the first trail file must be split (make it larger)"
    assert len(first_chunk.groups) == 1 and first_chunk.end.seqno == first_file.seqno
    assert 0 < first_chunk.end.rba < first_file.records

    env = {**os.environ, CRASH_ENV: "between_groups", "TRAILBOUND_METADATA_DSN": metadata_copy,
           "TRAILBOUND_TARGET_DSN": target_dsn, **crash_driver.env}
    crashed = subprocess.run(crash_driver.cli("--config", str(config_path), "replicat", "run", "REP1"),
                             env=env, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    # The first chunk is committed with its checkpoint row, nothing of the second is.
    row = checkpoint_row(target_dsn)
    assert TrailPosition(row["seqno"], row["rba"]) == first_chunk.end
    last = first_chunk.records.slice(len(first_chunk.records) - 1).to_pylist()[0]
    assert last["trans_ind"] in (trail.END, trail.WHOLE) and last["rba"] + 1 == row["rba"]
    # The file checkpoint follows lazily (a group replayed transaction by transaction saves
    # it after its first transaction, then at most every FILE_CHECKPOINT_SECONDS).
    assert TrailPosition(0, 0) < _file_checkpoint(metadata_copy).position <= first_chunk.end

    with MetadataStore.open(metadata_copy) as store:
        result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (result.started_from, result.start) == ("checkpoint table", first_chunk.end)
    assert differences(target_dsn, captured.truth) == {}
    end, last_csn = _trail_end(metadata_copy)
    assert _file_checkpoint(metadata_copy).position == end
    assert (checkpoint_row(target_dsn)["seqno"], checkpoint_row(target_dsn)["rba"]) == (end.seqno, end.rba)


def test_a_run_with_nothing_to_do_is_known_without_spark(captured, metadata_copy, target_dsn, tmp_path, spark):
    """idle.replicat_idle (what the DAG asks before spark-submit) says "nothing new" exactly
    when a run would apply nothing: after a run to the end, not with new files, not when
    the target's checkpoint row is behind the file checkpoint (a restored target)."""
    config = configuration.load(write_config(tmp_path, home=captured.directory, grouptransops=200, megabytes=0.1))
    _create_target(config, target_dsn)
    with MetadataStore.open(metadata_copy) as store:
        assert idle.replicat_idle(store, config, "REP1", target_dsn) is None, "never ran: the run adds the group"
        _hide_files_after(metadata_copy, captured.middle_seqno)
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        middle = checkpoint_row(target_dsn)
        reason = idle.replicat_idle(store, config, "REP1", target_dsn)
        assert reason is not None and "nothing new" in reason and f"after seqno {middle['seqno']} " in reason, reason
        _unhide_files(metadata_copy)
        assert idle.replicat_idle(store, config, "REP1", target_dsn) is None, "new trail files to apply"
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        assert idle.replicat_idle(store, config, "REP1", target_dsn) is not None
        with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
            cur.execute("UPDATE trailbound.ggcheckpoint SET seqno = %s, rba = %s WHERE group_name = 'REP1'",
                        (middle["seqno"], middle["rba"]))
        assert idle.replicat_idle(store, config, "REP1", target_dsn) is None, "the target is behind: catch it up"
        assert idle.replicat_idle(store, config, "REP1", "postgresql://nobody@127.0.0.1:1/none") is None, \
            "a check that cannot tell lets the run go ahead"


def _pg_tool(name: str) -> str:
    versioned = Path(f"/usr/lib/postgresql/15/bin/{name}")
    return str(versioned) if versioned.exists() else name


def test_a_target_restored_from_a_backup_converges(captured, metadata_copy, target_dsn, tmp_path, spark):
    config = configuration.load(write_config(tmp_path, home=captured.directory, grouptransops=200, megabytes=0.1))
    _create_target(config, target_dsn)
    with MetadataStore.open(metadata_copy) as store:
        _hide_files_after(metadata_copy, captured.middle_seqno)
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        backup = tmp_path / "target.dump"
        subprocess.run([_pg_tool("pg_dump"), "--format=custom", f"--file={backup}", f"--dbname={target_dsn}"],
                       check=True, capture_output=True)
        dumped = checkpoint_row(target_dsn)
        _unhide_files(metadata_copy)
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        assert differences(target_dsn, captured.truth) == {}
        subprocess.run([_pg_tool("pg_restore"), "--clean", "--if-exists", f"--dbname={target_dsn}", str(backup)],
                       check=True, capture_output=True)
        assert checkpoint_row(target_dsn)["log_csn"] == dumped["log_csn"]
        assert differences(target_dsn, captured.truth) != {}, "the restored target is behind the source again"
        result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (result.started_from, result.start) == ("checkpoint table", TrailPosition(dumped["seqno"], dumped["rba"]))
    assert result.transactions > 0 and result.skipped == 0
    assert differences(target_dsn, captured.truth) == {}


# ---------------------------------------------------------------- hand-written trails

def _orders(target_dsn: str, table=sql.Identifier("shop", "orders")) -> dict[int, str]:
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT id, note FROM {} ORDER BY id").format(table))
        return dict(cur.fetchall())


def _trail_records(store, upto: int | None = None) -> list[dict]:
    with store.transaction() as cur:
        cur.execute("SELECT seqno, path FROM trailbound.trail_file WHERE seqno <= %s ORDER BY seqno", (upto or 1 << 62,))
        files = cur.fetchall()
    return [r | {"seqno": f["seqno"], "path": f["path"]} for f in files for r in trail.iter_records(Path(f["path"]))]


def test_a_refused_record_is_named_and_the_checkpoint_stays_then_handlecollisions(tmp_path, spark, store, target_dsn):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), rec(11, "T1", "COMMIT"),
                        ins(20, "T2", 2), ins(21, "T2", 3), rec(22, "T2", "COMMIT"),
                        ins(30, "T3", 4), rec(31, "T3", "COMMIT"),
                        rec(40, "T4", "UPDATE", "shop.orders", key=5, note="changed"), rec(41, "T4", "COMMIT")], 100)
    config = configuration.load(write_config(tmp_path, tables=("shop.*",)))
    run_extract(spark, store, config, "EXT1")
    records = _trail_records(store)
    _create_target(config, target_dsn)
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("INSERT INTO shop.orders VALUES (3, 'already here')")

    for _ in range(2):  # and again: the same error, nothing moves
        with pytest.raises(ApplyError) as error:
            run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
        refused = next(r for r in records if r["xid"] == "T2" and json.loads(r["after"])["id"] == 3)
        assert (error.value.path, error.value.rba, error.value.csn, error.value.table, error.value.key) == \
            (refused["path"], refused["rba"], Csn.from_row(refused), "shop.orders", {"id": 3})
        assert str(error.value).startswith(f"{refused['path']} rba {refused['rba']}: CSN {Csn.from_row(refused)}")
        assert "duplicate key" in str(error.value)
        # T1 went in (replayed on its own), T2 did not: the checkpoint is right after T1.
        t1 = next(r for r in records if r["xid"] == "T1")
        row = checkpoint_row(target_dsn)
        assert (row["log_csn"], row["seqno"], row["rba"]) == (str(Csn.from_row(t1)), 1, t1["rba"] + 1)
        assert _orders(target_dsn) == {1: "n1", 3: "already here"}

    config = configuration.load(write_config(tmp_path, tables=("shop.*",), handlecollisions=True))
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert result.collisions == 2  # the duplicate insert of 3 became an update; the update of 5 was skipped
    assert _orders(target_dsn) == {1: "n1", 2: "n2", 3: "n3", 4: "n4"}
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(records[-1]))


def test_alter_replicat_repositions_and_info_shows_both_checkpoints(tmp_path, spark, store, target_dsn, capsys,
                                                                    monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), rec(11, "T1", "COMMIT"),
                        ins(20, "T2", 2), ins(21, "T2", 7, table="hr.salaries"), rec(22, "T2", "COMMIT"),
                        ins(30, "T3", 3), rec(31, "T3", "COMMIT"),
                        ins(40, "T4", 4), rec(41, "T4", "COMMIT")], 100)
    config_path = write_config(tmp_path, maps=[("shop.*", "Shop Copy.*")])  # hr.* is not mapped
    config = configuration.load(config_path)
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    run = lambda *words: cli.main(["--config", str(config_path), *words])  # noqa: E731
    run_extract(spark, store, config, "EXT1")
    records = _trail_records(store)
    csn = {r["xid"]: Csn.from_row(r) for r in records}
    copy = sql.Identifier("Shop Copy", "orders")
    assert run("target", "create") == 0 and "Shop Copy.orders" in capsys.readouterr().out

    assert run("alter", "replicat", "REP1", "atcsn", str(csn["T3"].scn)) == 0
    assert f"log_csn {csn['T3'].scn}@0:0:0" in capsys.readouterr().out
    assert checkpoint_row(target_dsn)["log_csn"] == f"{csn['T3'].scn}@0:0:0"
    assert run("replicat", "run", "REP1") == 0
    assert "skipped 2 transactions already applied" in capsys.readouterr().out
    assert _orders(target_dsn, copy) == {3: "n3", 4: "n4"}

    assert run("info", "replicat", "REP1", "--showch", "1") == 0
    shown = capsys.readouterr().out
    assert "The two agree" in shown and f"Log CSN                {csn['T4']}" in shown

    # extseqno keeps log_csn: going back over what is applied re-applies nothing.
    assert run("alter", "replicat", "REP1", "extseqno", "1", "extrba", "0") == 0
    capsys.readouterr()
    assert run("replicat", "run", "REP1") == 0
    assert "applied 0 transactions" in capsys.readouterr().out
    assert checkpoint_row(target_dsn)["log_csn"] == str(csn["T4"])

    # aftercsn on a target emptied by hand: everything after T1 comes back.
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute(sql.SQL("TRUNCATE {}").format(copy))
    assert run("alter", "replicat", "REP1", "aftercsn", str(csn["T1"])) == 0
    assert run("replicat", "run", "REP1") == 0
    assert _orders(target_dsn, copy) == {2: "n2", 3: "n3", 4: "n4"}
    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT to_regclass('hr.salaries') IS NULL")
        assert cur.fetchone()[0], "an unmapped table is neither created nor applied"

    capsys.readouterr()
    assert run("alter", "replicat", "REP1", "atcsn", "soon") == 1
    assert "usage: trailbound alter replicat" in capsys.readouterr().err


def test_lost_trail_recreated_from_log_bsn_applies_nothing_twice(tmp_path, spark, store, target_dsn, capsys,
                                                                monkeypatch):
    archive = new_archive(tmp_path)
    archive.segment(1, [ins(10, "T1", 1), rec(20, "T1", "COMMIT"), ins(30, "LONG", 2)], 100)
    archive.segment(1, [ins(110, "T2", 3), rec(120, "T2", "COMMIT")], 200)
    archive.segment(1, [rec(210, "LONG", "COMMIT"), ins(220, "T3", 4), rec(230, "T3", "COMMIT")], 300)
    config_path = write_config(tmp_path, tables=("shop.*",))
    config = configuration.load(config_path)
    _create_target(config, target_dsn)
    for until in (at(100), at(200)):
        run_extract(spark, store, config, "EXT1", until=until)
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    run_extract(spark, store, config, "EXT1")
    [lost] = {r["path"] for r in _trail_records(store) if r["xid"] == "T3"}
    Path(lost).unlink()  # the trail is lost before replicat applied its last file

    with pytest.raises(TrailboundError, match="Lost trails") as error:
        run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert lost in str(error.value)
    assert checkpoint_row(target_dsn)["log_csn"] == str(Csn.from_row(next(r for r in _trail_records(store, upto=2)
                                                                        if r["xid"] == "T2")))

    # The runbook: re-create the trail from the replica's log_bsn (capture re-created on a
    # new trail), then point replicat at it; the checkpoint table filters what it holds.
    row = checkpoint_row(target_dsn)
    assert row["log_bsn"] == "30", "T2 was written while LONG (from scn 30) was open"
    monkeypatch.setenv("TRAILBOUND_METADATA_DSN", store.connection.dsn)
    monkeypatch.setenv("TRAILBOUND_TARGET_DSN", target_dsn)
    run = lambda path, *words: cli.main(["--config", str(path), *words])  # noqa: E731
    assert run(config_path, "delete", "extract", "EXT1") == 0
    config_path = write_config(tmp_path, tables=("shop.*",), exttrail="dirdat/lr")
    assert run(config_path, "add", "extract", "EXT1", "--begin", "scn", row["log_bsn"]) == 0
    config = configuration.load(config_path)
    run_extract(spark, store, config, "EXT1")
    recaptured = [r["xid"] for r in trail.iter_records(tmp_path / "dirdat" / "lr000000001")]
    assert recaptured == ["T2", "LONG", "T3"], "T2 comes again: it started after log_bsn"
    assert run(config_path, "replicat", "run", "REP1") == 1
    assert "alter replicat REP1 extseqno" in capsys.readouterr().err
    assert run(config_path, "alter", "replicat", "REP1", "extseqno", "1", "extrba", "0") == 0
    assert "dirdat/lr from seqno 1 rba 0" in capsys.readouterr().out
    result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
    assert (result.skipped, result.transactions) == (1, 2)
    assert _orders(target_dsn) == {1: "n1", 2: "n2", 3: "n3", 4: "n4"}
    with store.transaction() as cur:
        cur.execute("SELECT trail, seqno, rba FROM trailbound.trail_reader WHERE reader_kind = 'replicat'")
        assert cur.fetchall() == [{"trail": str(tmp_path / "dirdat" / "lr"), "seqno": 1, "rba": 3}]
