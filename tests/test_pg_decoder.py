"""pgoutput protocol version 2 decoding, on bytes recorded from a real PostgreSQL 15
(tests/fixtures/pgoutput_v2.json: a slot with streaming on, logical_decoding_work_mem
64kB; the workload: inserts of every value kind into shop."Order Lines", a TOASTed
update, a price update that leaves the TOASTed note unchanged, a key update, a delete, a
REPLICA IDENTITY FULL table's insert/update/delete, logical messages, a TRUNCATE, a
streamed transaction with a rolled-back savepoint that commits, and one that aborts),
plus byte-exact messages built from the protocol documentation."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trailbound.sources.postgres import decoder as d
from trailbound.sources.postgres.lsn import Lsn

FIXTURE = Path(__file__).parent / "fixtures" / "pgoutput_v2.json"


@pytest.fixture(scope="module")
def messages():
    recorded = json.loads(FIXTURE.read_text())["messages"]
    decoder = d.Decoder()
    return [(m["data_start"], decoder.decode(bytes.fromhex(m["hex"]))) for m in recorded]


def test_lsn_text_form_round_trips():
    assert str(Lsn(0x16B374D848)) == "16/B374D848"
    assert Lsn.parse("16/B374D848") == Lsn(0x16B374D848) and Lsn.parse(" 0/0 ").value == 0
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse("16-B3")


def test_a_committed_transaction_decodes_with_typed_values(messages):
    kinds = [type(m).__name__ for _, m in messages[:7]]
    assert kinds == ["Begin", "Type", "Relation", "Insert", "Insert", "Update", "Commit"]
    begin, mood, relation, first, second, toast, commit = (m for _, m in messages[:7])
    assert begin.final_lsn == commit.commit_lsn and commit.end_lsn > commit.commit_lsn
    assert begin.commit_time == commit.commit_time and begin.commit_time.tzinfo is UTC
    assert (mood.namespace, mood.name) == ("shop", "mood")
    assert (relation.namespace, relation.name, relation.replica_identity) == ("shop", "Order Lines", "d")
    assert [c.name for c in relation.columns] == ["id", "note", "price", "ratio", "data", "doc", "tags", "at", "feeling"]
    assert [c.is_key for c in relation.columns] == [True] + [False] * 8
    assert relation.columns[0].type_oid == 23 and relation.columns[2].type_modifier == (10 << 16 | 2) + 4
    assert first.relation_oid == relation.oid and first.xid is None
    assert first.new[:7] == ("1", "héllo ✓", "12.50", "0.1", "\\xdeadbeef", '{"a": [1, 2]}', '{x,"y z"}')
    assert first.new[8] == "happy"
    assert second.new == ("2",) + (None,) * 8
    assert toast.old_kind is None and len(toast.new[1]) == 3200


def test_updates_carry_unchanged_toast_old_keys_and_full_old_rows(messages):
    updates = [m for _, m in messages if isinstance(m, d.Update)]
    price, key_change, full = updates[1], updates[2], updates[3]
    assert price.new[1] is d.UNCHANGED and price.new[2] == "13.00" and price.old is None
    assert key_change.old_kind == "K" and key_change.old[0] == "1" and key_change.new[0] == "3"
    assert full.old_kind == "O" and full.old == ("1", "one") and full.new == ("1", "uno")
    deletes = [m for _, m in messages if isinstance(m, d.Delete)]
    assert deletes[0].old_kind == "K" and deletes[0].old[0] == "3" and deletes[0].old[1] is None
    assert deletes[1].old_kind == "O" and deletes[1].old == ("1", "uno")


def test_messages_truncate_and_streams(messages):
    logical = [m for _, m in messages if isinstance(m, d.Message)]
    assert [(m.flags, m.prefix, m.content) for m in logical] == [
        (1, "rec", b"transactional message"), (0, "rec", b"plain message")]
    truncate = next(m for _, m in messages if isinstance(m, d.Truncate))
    assert truncate.options == 0 and len(truncate.relation_oids) == 1
    starts = [m for _, m in messages if isinstance(m, d.StreamStart)]
    assert starts[0].first_segment and not starts[1].first_segment
    committed, aborted = starts[0].xid, starts[-1].xid
    assert committed != aborted
    in_stream = [m for _, m in messages if isinstance(m, d.Insert) and m.xid is not None]
    assert {m.xid for m in in_stream} >= {committed, aborted}
    aborts = [m for _, m in messages if isinstance(m, d.StreamAbort)]
    # the savepoint rolled back inside the committed transaction, then the whole second one
    assert aborts[0].xid == committed and aborts[0].subxid != committed
    assert any(m.xid == aborts[0].subxid for m in in_stream)
    assert aborts[-1].xid == aborts[-1].subxid == aborted
    commit = next(m for _, m in messages if isinstance(m, d.StreamCommit))
    assert commit.xid == committed and commit.end_lsn > commit.commit_lsn


def test_byte_exact_messages_from_the_protocol_documentation():
    decoder = d.Decoder()
    origin = decoder.decode(b"O" + struct.pack("!Q", 0x1_0000_0010) + b"node_a\0")
    assert origin == d.Origin(Lsn(0x1_0000_0010), "node_a")
    decoder.decode(b"S" + struct.pack("!Ib", 700, 1))
    insert = decoder.decode(b"I" + struct.pack("!II", 701, 16384) + b"N" + struct.pack("!h", 3)
                            + b"t" + struct.pack("!i", 2) + b"42" + b"n" + b"b" + struct.pack("!i", 1) + b"\x00")
    assert insert == d.Insert(701, 16384, ("42", None, b"\x00"))
    assert decoder.decode(b"E") == d.StreamStop() and not decoder.in_stream
    commit = decoder.decode(b"c" + struct.pack("!IbQQq", 700, 0, 10, 20, 0))
    assert commit == d.StreamCommit(700, 0, Lsn(10), Lsn(20), datetime(2000, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize("data, complaint", [
    (b"", "empty message"),
    (b"Z", "unknown message type 'Z'"),
    (b"B" + struct.pack("!Q", 1), "message ends early at byte 9"),
    (b"I" + struct.pack("!I", 1) + b"X", "INSERT without its new tuple"),
    (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"t" + struct.pack("!i", 9) + b"ab",
     "runs past the message end"),
    (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"q", "unknown tuple value kind 'q'"),
    (b"E!", "1 unexpected byte"),
])
def test_malformed_messages_are_refused_with_the_byte_position(data, complaint):
    with pytest.raises(d.DecodeError, match=complaint):
        d.Decoder().decode(data)
