"""The miner on its own (no server): decoded messages -> archive records and segments;
what the slot sends again is archived once, whatever was durable when a pull died;
values, keys, TOAST, streamed subtransactions; a changed table gets a new version."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pyarrow.parquet as pq
import pytest

from trailbound.archive.segments import discover, load_defs
from trailbound.archive.writer import write_defs
from trailbound.positions import Scn
from trailbound.sources.postgres import decoder as d
from trailbound.sources.postgres import state as miner_state
from trailbound.sources.postgres.lsn import Lsn
from trailbound.sources.postgres.miner import Limits, Miner, PullResult
from trailbound.sources.postgres.reader import Received

T0 = datetime(2026, 11, 1, tzinfo=UTC)
TYPES = {(23, -1): "integer", (25, -1): "text", (701, -1): "double precision", (16, -1): "boolean"}
COLUMNS = (d.RelationColumn(1, "id", 23, -1), d.RelationColumn(0, "body", 25, -1),
           d.RelationColumn(0, "ratio", 701, -1), d.RelationColumn(0, "ok", 16, -1))
ORDERS = d.Relation(None, 100, "shop", "Orders", "d", COLUMNS)


@pytest.fixture
def archive(tmp_path):
    root = tmp_path / "archive"
    write_defs(root, [{"name": "shop.Orders", "key": ["id"], "columns": [
        {"name": "id", "type": "integer", "nullable": False}, {"name": "body", "type": "text", "nullable": True},
        {"name": "ratio", "type": "double precision", "nullable": True},
        {"name": "ok", "type": "boolean", "nullable": True}]}])
    miner_state.save(root, miner_state.MinerState(0, Lsn(1000), T0, "slot"))
    return root


def _miner(archive, limits=Limits(records=4)) -> Miner:
    state = miner_state.load(archive)
    return Miner(archive, load_defs(archive), limits, state, lambda oid, mod: TYPES[oid, mod], PullResult("PG"))


def _feed(miner: Miner, messages) -> None:
    for lsn, message in messages:
        miner.handle(Received(Lsn(lsn), T0 + timedelta(seconds=lsn / 1000), message))


def _records(archive) -> list[dict]:
    return [r for s in discover(archive) for r in pq.read_table(s.path).to_pylist()]


def _transaction(xid: int, first: int, keys: list[int], commit: int, same_lsn: bool = False):
    changes = [(first if same_lsn else first + 10 * i, d.Insert(None, 100, (str(k), f"n{k}", "0.1", "t")))
               for i, k in enumerate(keys)]
    return [(first, d.Begin(Lsn(commit), T0, xid)), (0, ORDERS), *changes,
            (commit + 40, d.Commit(0, Lsn(commit), Lsn(commit + 40), T0 + timedelta(seconds=1)))]


def test_records_segments_and_positions(archive):
    miner = _miner(archive)
    # a COPY: three rows in one WAL record, then a later transaction whose changes are
    # below what was archived (not streamed: it arrives at its commit)
    _feed(miner, _transaction(7, 1100, [1, 2, 3], 1200, same_lsn=True) + _transaction(8, 1050, [4], 1300))
    miner.finish(Lsn(1400), T0 + timedelta(minutes=1))
    records = _records(archive)
    assert [(r["op"], r["xid"], r["scn"]) for r in records] == [
        ("INSERT", "7", 1100), ("INSERT", "7", 1100), ("INSERT", "7", 1100), ("COMMIT", "7", 1200),
        ("INSERT", "8", 1201), ("COMMIT", "8", 1300)]
    assert json.loads(records[0]["after"]) == {"id": 1, "body": "n1", "ratio": 0.1, "ok": True}
    assert records[0]["table"] == "shop.Orders" and records[3]["ts"] == T0 + timedelta(seconds=1)
    segments = discover(archive)
    assert [(s.sequence, s.first_scn, s.next_scn, s.records) for s in segments] == [(1, Scn(1000), Scn(1201), 4),
                                                                                  (2, Scn(1201), Scn(1400), 2)]
    assert segments[-1].next_time == T0 + timedelta(minutes=1)


def test_everything_sent_again_is_archived_once_wherever_the_pull_died(archive):
    sent = _transaction(7, 1100, [1, 2, 3], 1200, same_lsn=True) + _transaction(8, 1250, [4, 5], 1300)
    miner = _miner(archive)
    _feed(miner, sent[:6])            # 7 whole (a segment of 4 records is cut), 8's BEGIN and Relation
    miner.finish(Lsn(1000), T0)       # (a pull that stopped early: 8 not committed yet)
    # the next pull wrote a segment's state, then died before its manifest
    ghost = miner_state.load(archive)
    ghost.sequence += 1
    miner_state.save(archive, ghost)
    miner = _miner(archive)
    assert not miner_state.state_path(archive, ghost.sequence).exists(), "a state past the manifests is dropped"
    _feed(miner, sent)                # the slot sends it all again
    miner.finish(Lsn(1400), T0)
    assert [(r["op"], r["xid"]) for r in _records(archive)] == [
        ("INSERT", "7"), ("INSERT", "7"), ("INSERT", "7"), ("COMMIT", "7"), ("INSERT", "8"), ("INSERT", "8"),
        ("COMMIT", "8")]
    assert miner.result.resent == 4
    # confirmed past both: the state forgets them
    state = miner_state.load(archive)
    state.forget_ended_before(Lsn(1400))
    assert state.txns == {}


def test_streamed_transaction_subtransaction_rollback_and_resend(archive):
    stream = [(2000, d.StreamStart(9, True)), (0, d.Relation(9, 100, "shop", "Orders", "d", COLUMNS)),
              (2010, d.Insert(9, 100, ("1", "a", "NaN", "f"))), (2020, d.Insert(10, 100, ("2", "b", None, None))),
              (2020, d.StreamStop())]
    miner = _miner(archive)
    _feed(miner, stream)
    miner.finish(Lsn(2020), T0)
    assert miner_state.load(archive).open_streamed().keys() == {9}
    miner = _miner(archive)
    _feed(miner, stream + [(2100, d.StreamAbort(9, 10)), (2200, d.StreamCommit(9, 0, Lsn(2150), Lsn(2190), T0)),
                           (2300, d.StreamAbort(11, 11))])
    miner.finish(Lsn(2300), T0)
    records = _records(archive)
    assert [(r["op"], r["xid"], r["parent_xid"]) for r in records] == [
        ("INSERT", "9", None), ("INSERT", "10", "9"), ("ROLLBACK", "10", "9"), ("COMMIT", "9", None)]
    assert json.loads(records[0]["after"])["ratio"] == "NaN" and json.loads(records[1]["after"])["ok"] is None
    assert records[-1]["scn"] == 2150


def test_updates_deletes_truncate_and_unchanged_toast(archive):
    miner = _miner(archive)
    _feed(miner, [(1100, d.Begin(Lsn(1500), T0, 7)), (0, ORDERS),
                  (1110, d.Update(None, 100, None, None, ("1", d.UNCHANGED, "0.5", "t"))),
                  (1120, d.Update(None, 100, "K", ("1", None, None, None), ("2", d.UNCHANGED, "0.5", "t"))),
                  (1130, d.Delete(None, 100, "K", ("2", None, None, None))),
                  (1140, d.Truncate(None, 0, (100,))), (1540, d.Commit(0, Lsn(1500), Lsn(1540), T0))])
    miner.finish(Lsn(1540), T0)
    changes = [(r["op"], r["before"], r["after"]) for r in _records(archive)][:4]
    assert changes == [("UPDATE", '{"id":1}', '{"id":1,"ratio":0.5,"ok":true}'),
                       ("UPDATE", '{"id":1}', '{"id":2,"ratio":0.5,"ok":true}'),
                       ("DELETE", '{"id":2}', None), ("TRUNCATE", None, None)]


def test_a_changed_table_gets_a_new_version_from_its_first_record(archive):
    """The old shape's records stay below the new version's scn even when the slot's
    positions would tie them (a transaction sent at its commit is raised to the floor);
    re-sent messages make no version; a version a killed pull wrote past the archive's
    end is forgotten."""
    altered = d.Relation(None, 100, "shop", "Orders", "d", COLUMNS + (d.RelationColumn(0, "extra", 23, -1),))
    other = d.Relation(None, 5, "shop", "Other", "d", (d.RelationColumn(1, "k", 23, -1),))
    old = _transaction(7, 1100, [1], 1500)
    new = [(1200, d.Begin(Lsn(1600), T0, 8)), (0, altered), (1200, d.Insert(None, 100, ("2", "b", "1", "t", "42"))),
           (0, other), (1210, d.Insert(None, 5, ("9",))), (1640, d.Commit(0, Lsn(1600), Lsn(1640), T0))]
    miner = _miner(archive, Limits(records=100))
    miner.catalog = lambda oid: {"extra": (False, "7")} if oid == 100 else {"k": (True, None)}
    _feed(miner, old + new)
    miner.finish(Lsn(1640), T0)
    defs = load_defs(archive)
    orders, table = defs["shop.Orders"], defs["shop.Other"]
    records = _records(archive)
    assert [v.version for v in orders.versions] == [1, 2] and orders.columns[-1].name == "extra"
    assert orders.columns[-1].default == "7" and orders.columns[-1].nullable
    first_new = next(r for r in records if r["xid"] == "8")
    assert orders.latest.scn == first_new["scn"] > max(r["scn"] for r in records if r["xid"] == "7")
    assert [orders.version_at(r["scn"]).version for r in records if r["table"] == "shop.Orders"] == [1, 2]
    assert table.versions[0].scn == next(r["scn"] for r in records if r["table"] == "shop.Other")
    assert table.key == ("k",) and not table.columns[0].nullable
    assert miner.new_versions == ["shop.Orders v2", "shop.Other v1"]
    # The slot sends it all again: nothing new
    miner = _miner(archive, Limits(records=100))
    _feed(miner, old + new)
    miner.finish(Lsn(1700), T0)
    assert miner.new_versions == [] and load_defs(archive) == defs
    # A version past the archive's end (written before a manifest that never came) is forgotten
    write_defs(archive, [t.as_json() for t in load_defs(archive).values()] + [{
        "name": "shop.Ghost", "columns": [{"name": "a", "type": "integer"}], "key": [],
        "versions": [{"version": 1, "scn": 999999, "columns": [{"name": "a", "type": "integer"}], "key": []}]}])
    assert "shop.Ghost" not in _miner(archive).defs


def test_an_idle_source_still_moves_next_scn(archive):
    miner = _miner(archive)
    miner.finish(Lsn(1000), T0)
    assert discover(archive) == []            # nothing moved: nothing written
    miner.finish(Lsn(5000), T0 + timedelta(seconds=30))
    (segment,) = discover(archive)
    assert (segment.first_scn, segment.next_scn, segment.records) == (Scn(1000), Scn(5000), 0)


def test_the_postgres_block_is_validated(tmp_path):
    from trailbound import config as configuration
    from trailbound.errors import ConfigError

    base = ("sources:\n  PG:\n    altarchivelogdest: a\n    postgres:\n      dsn_env: SRC\n      conn_id: src\n"
            "      publication: pub\n")
    path = tmp_path / "trailbound.yaml"
    path.write_text(base + "      slot: s1\n      table: [public.*]\n      segment: {bytes: 1M, seconds: 60}\n")
    block = configuration.load(path).postgres("pg")
    assert (block.slot, block.segment.bytes, block.segment.records, block.segment.seconds) == ("s1", 1 << 20,
                                                                                               100_000, 60)
    for options, complaint in [("      slot: Bad-Slot\n      table: [public.*]\n", "sources.PG.postgres.slot: a slot name"),
                               ("      slot: s1\n      table: [nodot]\n", "must be schema.table"),
                               ("      slot: s1\n      table: [a.b]\n      segmnt: {}\n", "segmnt: unknown option")]:
        path.write_text(base + options)
        with pytest.raises(ConfigError, match=complaint):
            configuration.load(path)
    path.write_text("sources:\n  SIM:\n    altarchivelogdest: a\n")
    with pytest.raises(ConfigError, match="source SIM has no postgres: block"):
        configuration.load(path).postgres("SIM")


def _pull_streaming_9_with_subtransaction_10(archive) -> None:
    """A pull that streams transaction 9 (change at 2010) with subtransaction 10 (changes at
    2020 and 2030) and ends before either ends."""
    stream = [(2000, d.StreamStart(9, True)), (0, d.Relation(9, 100, "shop", "Orders", "d", COLUMNS)),
              (2010, d.Insert(9, 100, ("1", "a", None, None))), (2020, d.Insert(10, 100, ("2", "b", None, None))),
              (2030, d.Insert(10, 100, ("3", "c", None, None))), (2030, d.StreamStop())]
    miner = _miner(archive)
    _feed(miner, stream)
    miner.finish(Lsn(2030), T0)


def test_a_subtransaction_rolled_back_where_it_was_not_streamed_again_is_rolled_back(archive):
    # Pull 1 streams transaction 9 with subtransaction 10 and dies before 10's abort.
    _pull_streaming_9_with_subtransaction_10(archive)
    # Pull 2: the server re-reads 9 from its start, discards 10 at its abort without having
    # streamed it this time (no Stream Abort), and sends 9 whole at its commit.
    miner = _miner(archive)
    _feed(miner, [(2010, d.Begin(Lsn(2150), T0, 9)), (0, ORDERS), (2010, d.Insert(None, 100, ("1", "a", None, None))),
                  (2100, d.Insert(None, 100, ("4", "d", None, None))),
                  (2190, d.Commit(0, Lsn(2150), Lsn(2190), T0))])
    miner.finish(Lsn(2190), T0)
    assert [(r["op"], r["xid"], r["parent_xid"]) for r in _records(archive)] == [
        ("INSERT", "9", None), ("INSERT", "10", "9"), ("INSERT", "10", "9"), ("INSERT", "9", None),
        ("ROLLBACK", "10", "9"), ("COMMIT", "9", None)]


def test_a_streamed_subtransaction_sent_again_whole_at_commit_is_not_rolled_back(archive):
    # Pull 1 streams transaction 9 with subtransaction 10 (the server streamed 9 because
    # other transactions filled logical_decoding_work_mem with it).
    _pull_streaming_9_with_subtransaction_10(archive)
    # Pull 2: this time the server did not stream 9; it sends it whole at its commit,
    # subtransaction 10's changes included (without their xid): 10 committed with 9.
    miner = _miner(archive)
    _feed(miner, [(2010, d.Begin(Lsn(2150), T0, 9)), (0, ORDERS), (2010, d.Insert(None, 100, ("1", "a", None, None))),
                  (2020, d.Insert(None, 100, ("2", "b", None, None))), (2030, d.Insert(None, 100, ("3", "c", None, None))),
                  (2100, d.Insert(None, 100, ("4", "d", None, None))),
                  (2190, d.Commit(0, Lsn(2150), Lsn(2190), T0))])
    miner.finish(Lsn(2190), T0)
    assert [(r["op"], r["xid"], r["parent_xid"]) for r in _records(archive)] == [
        ("INSERT", "9", None), ("INSERT", "10", "9"), ("INSERT", "10", "9"), ("INSERT", "9", None),
        ("COMMIT", "9", None)]


def test_streamed_records_carry_the_send_time_in_utc_across_a_dst_fall_back(archive, monkeypatch):
    # psycopg2 gives a message's send time as a naive local time; the archive's ts is UTC.
    # Europe/Berlin repeats 02:00-03:00 local on 2026-10-25: two changes sent an hour apart
    # in the same naive second must still be an hour apart.
    import time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        sent = [datetime(2026, 10, 24, 23, 59, 59, 500_000, tzinfo=UTC), datetime(2026, 10, 25, 0, 59, 59, 100_000, tzinfo=UTC),
                datetime(2026, 10, 25, 1, 59, 59, 200_000, tzinfo=UTC), datetime(2026, 10, 25, 2, 30, tzinfo=UTC)]
        local = [datetime.fromtimestamp(moment.timestamp()) for moment in sent]
        assert local[1].replace(microsecond=0) == local[2].replace(microsecond=0)  # the same naive second
        miner = _miner(archive, Limits(records=100))
        miner.handle(Received(Lsn(2000), local[0], d.StreamStart(9, True)))
        miner.handle(Received(Lsn(0), local[0], ORDERS))
        for i, moment in enumerate(local):
            miner.handle(Received(Lsn(2010 + i), moment, d.Insert(9, 100, (str(i), "x", None, None))))
        miner.handle(Received(Lsn(2100), local[-1], d.StreamStop()))
        miner.finish(Lsn(2100), sent[-1])
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert [r["ts"] for r in _records(archive)] == sent


def _tuple_bytes(values) -> bytes:
    """pgoutput TupleData: None as 'n', d.UNCHANGED as 'u', text as 't' with its length."""
    import struct

    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is d.UNCHANGED:
            out += b"u"
        else:
            raw = value.encode()
            out += b"t" + struct.pack("!i", len(raw)) + raw
    return out


def test_the_pulls_fast_json_images_are_the_typed_paths_text_value_by_value():
    """rowjson (the pull's hot path: tuple bytes straight to JSON) writes exactly what the
    decoder's values through values.converter and encode_json write, for every kind of
    value: escapes, control characters, non-ASCII, floats PostgreSQL and Python spell
    differently, NaN and infinities, NULL, unchanged TOAST, keys of a subset of columns."""
    from trailbound.sources.postgres import rowjson
    from trailbound.sources.postgres.miner import _image, _Relation
    from trailbound.sources.postgres.values import converter

    columns = (("id", 20), ("Body \"Text\"", 25), ("ratio", 701), ("ok", 16), ("n", 1700), ("small", 21),
               ("r4", 700), ("doc", 3802), ("é", 25))
    names, oids = tuple(n for n, _ in columns), tuple(o for _, o in columns)
    key = (0, 5)
    relation = _Relation("s.t", names, tuple(converter(o) for o in oids), key,
                         rowjson.RowJson(names, oids, key))
    rows = [
        ("1", "plain", "0.1", "t", "12.500", "-3", "1.5e-07", '{"a": [1, "b"]}', "x"),
        ("-9223372036854775808", 'quote " and \\ back\\slash', "100000", "f", "NaN", "0", "Infinity",
         "[]", "tab\there\nline\r\x01\x1f end"),
        ("42", "héllo ✓ 𝄞", "-Infinity", "t", "-0.0001", "32767", "-0", '"s"', "\u2028\u2029\x7f"),
        ("7", None, None, None, None, None, None, None, None),
        ("8", d.UNCHANGED, "1e+100", "f", d.UNCHANGED, "1", "3.4028235e+38", d.UNCHANGED, ""),
    ]
    for values in rows:
        data = b"pad" + _tuple_bytes(values)
        parsed, at = relation.json.values(data, 3)
        assert at == len(data)
        assert relation.json.image(parsed) == relation.image(values)
        assert relation.json.key_image(parsed) == relation.key_image(values)
        assert json.loads(relation.json.image(parsed)) == json.loads(_image(names, relation.convert, values))
    insert = b"I" + (100).to_bytes(4, "big") + b"N" + _tuple_bytes(rows[1])
    kind, _, oid, _, _, new = d.row_change(insert, False, {100: relation.json.values})
    assert (kind, oid, relation.json.image(new)) == (ord("I"), 100, relation.image(rows[1]))
    for cut in (3, 20):
        with pytest.raises(d.DecodeError, match="message ends early|runs past the message end"):
            d.row_change(insert[:-cut], False, {100: relation.json.values})


def test_the_states_transaction_text_is_encode_jsons_for_every_kind_of_transaction():
    # the state file's text, written directly for transactions without subtransactions,
    # is what encode_json writes (the state is compared and read back as JSON)
    from trailbound.archive.writer import encode_json

    txns = [miner_state.Txn(), miner_state.Txn(48112368, 21, False, 48181184, "2026-11-27T11:00:50.618704+00:00"),
            miner_state.Txn(5, 1, True, None, 'a "quoted\\" time\n é'),
            miner_state.Txn(5, 2, True, 9, None, [7], {"7": [3, 5]})]
    for txn in txns:
        assert miner_state._txn_json(txn) == encode_json(vars(txn))
    state = miner_state.MinerState(1, Lsn(10), T0, "slot", dict(enumerate(txns)))
    assert json.loads(state.to_text())["txns"] == {str(xid): vars(txn) for xid, txn in enumerate(txns)}


def test_the_compiled_row_images_are_rowjsons_text_and_errors(monkeypatch):
    """_rowjson_c (built by make) gives what rowjson's Python gives for every row change:
    inserts, updates with and without the old key or row, deletes, streamed ones; escapes,
    control characters, non-ASCII, NULL; and what it leaves to the Python (unchanged
    TOAST, floats, bytes that are not UTF-8, malformed messages) the same text or error."""
    import struct

    _rowjson_c = pytest.importorskip("trailbound.sources.postgres._rowjson_c",
                                     reason="the compiled row images are not built (make)")
    from trailbound.sources.postgres import rowjson

    plain = (("id", 20), ("Body \"Text\"", 25), ("ok", 16), ("small", 21), ("doc", 3802), ("é", 25), ("t", 1114))
    with_float = plain + (("ratio", 701),)
    shapes, readers = {}, {}
    for oid, columns, key in ((100, plain, (0, 3)), (101, with_float, (0,)), (102, plain, ())):
        names, oids = tuple(n for n, _ in columns), tuple(o for _, o in columns)
        shapes[oid] = rowjson.RowJson(names, oids, key)
        readers[oid] = shapes[oid].values
    assert shapes[100].compiled is not None and shapes[101].compiled is None  # floats: the Python's
    rows = [
        ("1", "plain", "t", "-3", '{"a": [1, "b"]}', "x", "2026-11-27 10:00:00"),
        ("-9223372036854775808", 'quote " and \\ back\\slash', "f", "0", "[]", "tab\there\nline\r\x01\x1f\x08\x0c end",
         ""),
        ("42", "héllo ✓ 𝄞", "t", "32767", '"s"', "\u2028\u2029\x7f", "x"),
        ("7", None, None, None, None, None, None),
        ("8", d.UNCHANGED, "f", "1", d.UNCHANGED, "", None),
    ]
    messages = []
    for oid in shapes:
        for values in rows:
            values = values + ("0.5",) if oid == 101 else values
            row = _tuple_bytes(values)
            for head in (struct.pack("!I", oid), struct.pack("!II", 77, oid)):
                messages += [b"I" + head + b"N" + row, b"U" + head + b"N" + row, b"U" + head + b"K" + row + b"N" + row,
                             b"U" + head + b"O" + row + b"N" + row, b"D" + head + b"K" + row, b"D" + head + b"O" + row]
    # not UTF-8 in a text value; a width the relation does not have; a value kind it does not know
    messages += [messages[0].replace(b"plain", b"pl\xe9in"), b"I" + struct.pack("!I", 100) + b"N" + _tuple_bytes(("1",)),
                 messages[0].replace(b"tplain"[:1] + struct.pack("!i", 5), b"b" + struct.pack("!i", 5))]
    compared = 0
    for message in messages:
        in_stream = len(message) > 9 and message[1:5] == struct.pack("!I", 77)
        for data in [message] + [message[:-cut] for cut in (1, 3, 20) if cut < len(message)] + [message + b"z"]:
            try:
                expected = rowjson._row_images(data, in_stream, shapes, readers)
            except Exception as exc:  # noqa: BLE001: the very error is compared
                with pytest.raises(type(exc), match=re.escape(str(exc))):
                    _rowjson_c.row_images(data, in_stream, shapes, readers)
            else:
                assert _rowjson_c.row_images(data, in_stream, shapes, readers) == expected
            compared += 1
    assert compared > 600
    # and the compiled code makes the usual messages' images itself, without the Python
    monkeypatch.setattr(_rowjson_c, "fallback", None)
    for message in messages[:6]:
        assert _rowjson_c.row_images(message, False, shapes, readers) == rowjson._row_images(message, False, shapes,
                                                                                              readers)
