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
