"""The pull's replication stream, read from the connection's socket in chunks and cut into
messages by trailbound (sources/postgres/reader.py): a message larger than one read
arrives whole, a slot that another session streams from is refused with one line, a slot
that does not exist is told apart, and the slot is confirmed only to what the archive
holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import psycopg2
import pytest

from pg_source_kit import SOURCE_ENV, execute, query, slot_confirmed, source_dsn, source_server, write_config  # noqa: F401
from trailbound import config as configuration
from trailbound.archive.segments import discover
from trailbound.errors import TrailboundError
from trailbound.sources.postgres import reader as slot_reader
from trailbound.sources.postgres.admin import pull

pytestmark = [pytest.mark.pg]

SLOT, PUBLICATION = "trailbound_pg", "trailbound_pub"


def _added(tmp_path: Path, dsn: str) -> Path:
    execute(dsn, "CREATE TABLE items (id int PRIMARY KEY, pad text)")
    config_path = write_config(tmp_path, tables=("public.items",))
    added = subprocess.run([sys.executable, "-m", "trailbound.cli", "--config", str(config_path), "add", "source", "PG"],
                           env={**os.environ, SOURCE_ENV: dsn}, capture_output=True, text=True, timeout=300)
    assert added.returncode == 0, added.stderr
    return config_path


def test_a_row_larger_than_a_read_is_archived_whole_and_the_slot_confirmed_to_the_archive(source_dsn, tmp_path,
                                                                                         monkeypatch):
    config_path = _added(tmp_path, source_dsn)
    # ~3.2 MB of text in one INSERT message (pgoutput sends the value whole), between small rows
    execute(source_dsn, "INSERT INTO items VALUES (1, 'small')",
            "INSERT INTO items SELECT 2, string_agg(md5(i::text), '') FROM generate_series(1, 100000) i",
            "INSERT INTO items SELECT g, md5(g::text) FROM generate_series(3, 400) g")
    monkeypatch.setenv(SOURCE_ENV, source_dsn)
    config = configuration.load(config_path)

    result = pull(config, "PG")

    archive = config.archive_dir("PG")
    records = [row for segment in discover(archive) for row in pq.read_table(segment.path).to_pylist()
               if row["op"] == "INSERT"]
    pads = {json.loads(row["after"])["id"]: json.loads(row["after"])["pad"] for row in records}
    assert sorted(pads) == list(range(1, 401)) and result.changes == 400 and result.commits == 3
    big = query(source_dsn, "SELECT pad FROM items WHERE id = 2")[0][0]
    assert len(big) == 3_200_000 and pads[2] == big
    assert pads[1] == "small" and pads[400] == query(source_dsn, "SELECT md5('400')")[0][0]
    end = discover(archive)[-1].next_scn.value  # never confirmed past what the archive holds
    assert result.confirmed is not None and slot_confirmed(source_dsn) == result.confirmed.value <= end


def test_a_slot_another_session_streams_from_is_refused_and_a_missing_one_told_apart(source_dsn, tmp_path):
    _added(tmp_path, source_dsn)
    with slot_reader.SlotReader(source_dsn, SLOT, PUBLICATION) as holder:
        holder.start()
        assert holder.at_start is not None
        with slot_reader.SlotReader(source_dsn, SLOT, PUBLICATION) as second:
            with pytest.raises(TrailboundError, match=f"replication slot '{SLOT}' is in use by another process"):
                second.start(wait_for_slot=0.5)
    with slot_reader.SlotReader(source_dsn, "no_such_slot", PUBLICATION) as missing:
        missing.start()
        assert missing.at_start is None and missing.stream is None


def _stream_on(sock) -> slot_reader._SocketStream:
    """A _SocketStream reading `sock` (one end of a socket pair), as after START_REPLICATION."""
    stream = object.__new__(slot_reader._SocketStream)
    stream.socket, stream.pending, stream.wal_end, stream.confirmed = sock, b"", 0, 0
    sock.settimeout(slot_reader._READ_WAIT)
    return stream


def test_the_compiled_stream_cutting_and_boundary_scan_are_the_readers_python():
    """_reader_c (built by make) cuts the stream into the same messages, WAL end, rest of a
    message received in part and replies to keepalives as reader.py's loop, which takes
    over at the first frame it leaves (an unknown CopyData, the server's error); and finds
    the same transaction boundaries in a batch."""
    import socket
    import struct

    _reader_c = pytest.importorskip("trailbound.sources.postgres._reader_c",
                                    reason="the compiled stream framing is not built (make)")

    def xlog(start, wal_end, payload):
        return struct.pack("!BIB", 0x64, 4 + 1 + 24 + len(payload), 0x77) + struct.pack("!QQq", start, wal_end, -5) + payload

    def keepalive(wal_end, reply):
        return struct.pack("!BIBQq?", 0x64, 4 + 1 + 17, 0x6B, wal_end, 7, reply)

    frames = (xlog(100, 200, b"B" + bytes(20)) + xlog(101, 201, b"I\x00\x00\x00\x01N") + keepalive(300, False)
              + xlog(102, 202, b"") + keepalive(310, True) + xlog(103, 203, b"C" + bytes(25)))
    unknown = struct.pack("!BIB", 0x64, 4 + 1 + 3, 0x7A) + b"abc"  # a CopyData kind the stream does not use
    error = struct.pack("!BI", 0x45, 4 + 12) + b"SERROR\0Mboom\0\0"
    reads = [frames + xlog(104, 204, b"Dpart")[:9], xlog(104, 204, b"Dpart")[9:] + unknown + xlog(105, 205, b"E"),
             keepalive(400, True) + error]
    results = []
    for compiled in (None, _reader_c):
        ours, server = socket.socketpair()
        try:
            stream, saved = _stream_on(ours), slot_reader._reader_c
            slot_reader._reader_c = compiled
            try:
                read = []
                for chunk in reads:
                    server.sendall(chunk)
                    try:
                        read.append((stream.read(), stream.wal_end, stream.pending))
                    except psycopg2.Error as exc:
                        read.append(str(exc))
            finally:
                slot_reader._reader_c = saved
            server.settimeout(1)
            replies = server.recv(1 << 16)
            # each reply a Standby Status Update flushing the confirmed position (0 here); its clock aside
            results.append((read, [struct.unpack_from("!BIBQQQ", replies, at) for at in range(0, len(replies), 39)]))
        finally:
            ours.close()
            server.close()
    assert results[0] == results[1]
    (read, replies) = results[0]
    assert [m[0] for m in read[0][0]] == [100, 101, 102, 103] and read[0][1] == 203 and read[1][1] == 205
    assert "boom" in read[2] and len(replies) == 2

    batch = [(i, 1000 + i, 0, payload) for i, payload in
             enumerate([b"B1", b"I", b"C1", b"", b"S1", b"I", b"E", b"B2", b"C2", b"S3", b"I"])]
    for boundary in (True, False):
        for safe in (0, 1005, 2000):
            for end in (0, 1003, 1006, 1008, 5000):
                assert _reader_c.scan(batch, boundary, safe, end) == slot_reader._scan_py(batch, boundary, safe, end)
