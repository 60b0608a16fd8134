"""The archive writer writes segments and table definitions exactly as the contract says.

Fast tier: pure Python, no Spark, no database.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trailbound.archive.contract import DEFS_FILE, MANIFEST_FIELDS, RECORD_FIELDS, SEGMENT_RE
from trailbound.archive.writer import DROP, write_defs, write_segment, write_segment_columns
from trailbound.positions import Scn

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def sample_records() -> list[dict]:
    """A small transaction with awkward content: a savepoint, Unicode, quotes, NULLs."""
    ts = T0 + timedelta(microseconds=123456)
    return [
        {"scn": 100, "ts": ts, "xid": "a/b", "parent_xid": None, "op": "BEGIN", "table": None,
         "before": None, "after": None},
        {"scn": 101, "ts": ts, "xid": "a/b", "parent_xid": None, "op": "INSERT",
         "table": 'shop.Kunden "Prüfung"',
         "before": None, "after": {"Kunden-Nr": 1, "select": "Zoë 🚀 \"q\" \\", "naïve": None}},
        {"scn": 102, "ts": ts + timedelta(seconds=1), "xid": "sub 1", "parent_xid": "a/b",
         "op": "UPDATE", "table": "shop.orders",
         "before": '{"id":5}', "after": '{"id":5,"total":"12345.678901234567890"}'},
        {"scn": 102, "ts": ts + timedelta(seconds=1), "xid": "sub 1", "parent_xid": "a/b",
         "op": "ROLLBACK", "table": None, "before": None, "after": None},
        {"scn": 104, "ts": ts + timedelta(seconds=2), "xid": "a/b", "parent_xid": None,
         "op": "COMMIT", "table": None, "before": None, "after": None},
    ]


def write_sample(directory, fmt, **options):
    return write_segment(
        directory, thread=2, sequence=7, records=sample_records(), first_scn=Scn(100), next_scn=Scn(105),
        first_time=T0, next_time=T0 + timedelta(minutes=15), fmt=fmt, **options,
    )


def read_records(path) -> list[dict]:
    """Records as stored, ts normalised to an aware datetime."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    records = []
    for line in path.read_text("utf-8").splitlines():
        record = json.loads(line)
        record["ts"] = datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        records.append(record)
    return records


def expected_records() -> list[dict]:
    expected = []
    for rba, record in enumerate(sample_records()):
        row = {"rba": rba, **record}
        for image in ("before", "after"):
            if isinstance(row[image], dict):
                row[image] = json.dumps(row[image], ensure_ascii=False, separators=(",", ":"))
        expected.append({field: row[field] for field in RECORD_FIELDS})
    return expected


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_records_round_trip(tmp_path, fmt):
    manifest_path = write_sample(tmp_path, fmt)
    data_path = tmp_path / f"arch_2_000000007.{fmt}"
    assert manifest_path == tmp_path / "arch_2_000000007.json"
    assert read_records(data_path) == expected_records()


def test_parquet_schema_is_exactly_the_contract(tmp_path):
    write_sample(tmp_path, "parquet")
    schema = pq.read_schema(tmp_path / "arch_2_000000007.parquet")
    assert schema.names == list(RECORD_FIELDS)
    assert [schema.field(name).type for name in schema.names] == [
        pa.int64(), pa.int64(), pa.timestamp("us", tz="UTC"),
        pa.string(), pa.string(), pa.string(), pa.string(), pa.string(), pa.string(),
    ]


def test_jsonl_is_utf8_with_iso_times(tmp_path):
    write_sample(tmp_path, "jsonl")
    raw = (tmp_path / "arch_2_000000007.jsonl").read_bytes()
    lines = raw.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 6  # one line per record, each ends with \n
    first = json.loads(lines[0])
    assert list(first) == list(RECORD_FIELDS)
    assert first["ts"] == "2026-11-01T00:00:00.123456Z"
    # Unicode as is, not \u escapes
    assert "Zoë 🚀".encode() in raw and "Prüfung".encode() in raw


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_manifest_describes_the_data_file(tmp_path, fmt):
    manifest_path = write_sample(tmp_path, fmt)
    data = (tmp_path / f"arch_2_000000007.{fmt}").read_bytes()
    manifest = json.loads(manifest_path.read_text("utf-8"))
    assert tuple(manifest) == MANIFEST_FIELDS  # "closed" only on a closed segment
    assert manifest == {
        "thread": 2, "sequence": 7, "first_scn": 100, "next_scn": 105,
        "first_time": "2026-11-01T00:00:00.000000Z", "next_time": "2026-11-01T00:15:00.000000Z",
        "records": 5, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "format": fmt,
    }
    # nothing else left in the directory: no temporary files
    assert sorted(p.name for p in tmp_path.iterdir()) == [manifest_path.name, f"arch_2_000000007.{fmt}"]
    assert all(SEGMENT_RE.match(p.name) for p in tmp_path.iterdir())


def test_closed_segment_says_so(tmp_path):
    manifest = json.loads(write_sample(tmp_path, "parquet", closed=True).read_text("utf-8"))
    assert manifest["closed"] is True


def test_no_manifest_when_the_data_file_cannot_be_written(tmp_path):
    # A directory where the data file should go makes writing the data fail: the
    # manifest, written last, must then not exist (readers would trust a missing file).
    (tmp_path / "arch_2_000000007.parquet").mkdir()
    with pytest.raises(OSError):
        write_sample(tmp_path, "parquet")
    assert not (tmp_path / "arch_2_000000007.json").exists()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_same_input_same_bytes(tmp_path, fmt):
    write_sample(tmp_path / "one", fmt)
    write_sample(tmp_path / "two", fmt)
    for name in (f"arch_2_000000007.{fmt}", "arch_2_000000007.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_empty_segment(tmp_path, fmt):
    path = write_segment(tmp_path, thread=3, sequence=1, records=[], first_scn=Scn(10), next_scn=Scn(42),
                         first_time=T0, next_time=T0 + timedelta(minutes=15), fmt=fmt)
    manifest = json.loads(path.read_text("utf-8"))
    assert manifest["records"] == 0 and manifest["next_scn"] == 42
    data_path = tmp_path / f"arch_3_000000001.{fmt}"
    assert read_records(data_path) == []
    assert manifest["bytes"] == data_path.stat().st_size
    if fmt == "parquet":
        assert pq.read_schema(data_path).names == list(RECORD_FIELDS)


def test_writes_deliberately_broken_segments(tmp_path):
    """Tests of readers need broken archives: the writer writes what it is told."""
    records = sample_records()
    records[2]["rba"] = 7  # an rba gap
    records[3]["op"] = "MERGE"  # an unknown op
    records[4]["before"] = "{not json"  # taken as already serialised
    path = write_segment(
        tmp_path, thread=1, sequence=3, records=records, first_scn=Scn(100), next_scn=Scn(101),
        first_time=T0, next_time=T0, fmt="jsonl",
        manifest_overrides={"sha256": "0" * 64, "records": 99, "format": DROP, "extra": 1},
    )
    manifest = json.loads(path.read_text("utf-8"))
    assert manifest["sha256"] == "0" * 64 and manifest["records"] == 99 and manifest["extra"] == 1
    assert "format" not in manifest
    stored = read_records(tmp_path / "arch_1_000000003.jsonl")
    assert [r["rba"] for r in stored] == [0, 1, 7, 3, 4]
    assert stored[3]["op"] == "MERGE" and stored[4]["before"] == "{not json"


def test_columns_fast_path_matches_records(tmp_path):
    records = sample_records()
    columns = {field: [r[field] for r in records] for field in ("scn", "xid", "parent_xid", "op", "table")}
    columns["ts"] = [(r["ts"] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) for r in records]
    columns["before"] = [e["before"] for e in expected_records()]
    columns["after"] = [e["after"] for e in expected_records()]
    for fmt in ("parquet", "jsonl"):
        write_sample(tmp_path / "records", fmt)
        write_segment_columns(tmp_path / "columns", thread=2, sequence=7, columns=columns,
                              first_scn=Scn(100), next_scn=Scn(105), first_time=T0,
                              next_time=T0 + timedelta(minutes=15), fmt=fmt)
        for name in (f"arch_2_000000007.{fmt}", "arch_2_000000007.json"):
            assert (tmp_path / "records" / name).read_bytes() == (tmp_path / "columns" / name).read_bytes()


def test_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError):
        write_sample(tmp_path, "csv")
    assert list(tmp_path.iterdir()) == []


def test_write_defs(tmp_path):
    tables = [
        {"name": 'shop.Kunden "Prüfung"',
         "columns": [{"name": "Kunden-Nr", "type": "bigint", "nullable": False},
                     {"name": "naïve", "type": "boolean", "nullable": True}],
         "key": ["Kunden-Nr"]},
        {"name": "shop.page_views", "columns": [{"name": "url", "type": "text", "nullable": False}],
         "key": []},
    ]
    path = write_defs(tmp_path / "archive", tables)
    assert path == tmp_path / "archive" / DEFS_FILE
    assert json.loads(path.read_text("utf-8")) == {"tables": tables}
    assert "Prüfung" in path.read_text("utf-8")
    assert [p.name for p in path.parent.iterdir()] == [DEFS_FILE]


def test_the_compiled_string_columns_are_string_builders_arrays_and_parquet_bytes(tmp_path):
    """_arrow_c (built by make) makes the very array StringBuilder makes, so the segment's
    Parquet bytes are the same: NULLs anywhere, empty strings, non-ASCII, a column of NULLs."""
    pytest.importorskip("trailbound.archive._arrow_c", reason="the compiled string columns are not built (make)")
    from trailbound.archive import writer

    columns = [["a", None, "", "héllo ✓ 𝄞", "x" * 1000, None, None, "\x00\n"],
               ["no", "null", "at", "all"], [None] * 9, [], ["é"] * 17]
    for values in columns:
        compiled = writer._string_array(values)
        builder = writer.StringBuilder()
        builder.append_values(values)
        expected = builder.finish()
        assert compiled.equals(expected) and compiled.null_count == expected.null_count
        assert compiled.to_pylist() == values
    write_sample(tmp_path / "c", "parquet")
    original, writer._arrow_c = writer._arrow_c, None  # the pure-Python path: StringBuilder's
    try:
        write_sample(tmp_path / "p", "parquet")
    finally:
        writer._arrow_c = original
    name = "arch_2_000000007.parquet"
    assert (tmp_path / "p" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()
