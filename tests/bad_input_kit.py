"""The bad-input corpus: malformed redo archives and corrupt trails, each built from a
small valid pipeline, and a snapshot of everything a failed command must leave alone.

A `Pipeline` is built once per test module (a capture run, a pump run and a replicat run
over a tiny archive), then saved: its home directory is copied aside and its metadata and
target databases become templates. `Pipeline.restore()` puts all three back, so every
case starts from the same state at the cost of two CREATE DATABASE ... TEMPLATE and one
directory copy, not of a capture run.

Each archive case is a function that damages the archive and returns what the error must
say: the file, the rba (None where the contract says the error points at a manifest or a
whole data file) and a message only that check produces.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psycopg2
import psycopg2.extensions
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg2 import sql

from capture_kit import TABLES, Archive, ins, rec
from pump_kit import write_config
from trailbound.positions import Scn
from trailbound.trail import format as trail
from trailbound.archive.writer import write_defs

THREAD = 1
SEGMENT_2 = "arch_1_000000002"


# ------------------------------------------------------------------ the valid pipeline

def write_pipeline_config(home: Path) -> Path:
    """Capture EXT1 -> trail dirdat/lt (one transaction per file) -> pump PMP1 -> remote/rt;
    replicat REP1 applies dirdat/lt."""
    return write_config(home, {"PMP1": {"exttrail": "dirdat/lt", "rmttrail": "remote/rt"}}, megabytes=0.0001,
                        extract_tables=("shop.*",), replicats={"REP1": {"exttrail": "dirdat/lt", "source": "SRC"}})


def first_segment(archive: Archive) -> None:
    """A commits; OPEN stays open with a savepoint (OPEN.SP) whose id a later segment may
    wrongly name as a parent."""
    archive.segment(THREAD, [ins(10, "A", 1), rec(20, "A", "COMMIT"), ins(30, "OPEN", 2),
                             ins(31, "OPEN.SP", 3, parent_xid="OPEN")], 100)


def good_records() -> list[dict]:
    return [ins(110, "B", 10), rec(120, "B", "COMMIT")]


def _admin(server_dsn: str):
    connection = psycopg2.connect(psycopg2.extensions.make_dsn(server_dsn, dbname="postgres"))
    connection.autocommit = True
    return connection


@dataclass
class Pipeline:
    home: Path
    config_path: Path
    archive: Archive
    server_dsn: str
    metadata_db: str
    target_db: str
    saved: Path | None = None

    @property
    def metadata_dsn(self) -> str:
        return psycopg2.extensions.make_dsn(self.server_dsn, dbname=self.metadata_db)

    @property
    def target_dsn(self) -> str:
        return psycopg2.extensions.make_dsn(self.server_dsn, dbname=self.target_db)

    def save(self) -> None:
        """Keep the current state: the files copied aside, the databases as templates."""
        self.saved = self.home.with_name(self.home.name + "-saved")
        shutil.rmtree(self.saved, ignore_errors=True)
        shutil.copytree(self.home, self.saved, symlinks=True)
        self.templates = {}
        admin = _admin(self.server_dsn)
        try:
            with admin.cursor() as cur:
                for kind in ("metadata", "target"):
                    name = getattr(self, f"{kind}_db")
                    template = f"{name}_tpl"
                    cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template)))
                    cur.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(template),
                                                                                sql.Identifier(name)))
                    self.templates[kind] = template
        finally:
            admin.close()

    def restore(self) -> None:
        shutil.rmtree(self.home)
        shutil.copytree(self.saved, self.home, symlinks=True)
        admin = _admin(self.server_dsn)
        try:
            with admin.cursor() as cur:
                for kind, template in self.templates.items():
                    name = getattr(self, f"{kind}_db")
                    cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                    cur.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                                sql.Identifier(template)))
        finally:
            admin.close()
        self.archive.next_sequence, self.archive.next_scn = {THREAD: 2}, {THREAD: 100}

    def drop(self) -> None:
        admin = _admin(self.server_dsn)
        try:
            with admin.cursor() as cur:
                for name in (self.metadata_db, self.target_db, *self.templates.values()):
                    cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        finally:
            admin.close()


def new_pipeline(home: Path, server_dsn: str, tag: str) -> Pipeline:
    home.mkdir(parents=True, exist_ok=True)
    write_defs(home / "archive", TABLES)
    archive = Archive(home / "archive")
    pipeline = Pipeline(home, write_pipeline_config(home), archive, server_dsn, f"tb_bad_meta_{tag}",
                        f"tb_bad_target_{tag}")
    admin = _admin(server_dsn)
    try:
        with admin.cursor() as cur:
            for name in (pipeline.metadata_db, pipeline.target_db):
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    finally:
        admin.close()
    return pipeline


# ------------------------------------------------------------------ what must not change

def _database_digest(dsn: str, schemas: tuple[str, ...] | None) -> dict[str, str]:
    """md5 of every table's rows (status columns that a refused run may set are left out:
    last_started says a run was tried, it moves no position)."""
    digests = {}
    with psycopg2.connect(dsn) as connection, connection.cursor() as cur:
        cur.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
                    " AND table_schema NOT IN ('pg_catalog', 'information_schema')"
                    " AND (%s::text[] IS NULL OR table_schema = ANY(%s::text[])) ORDER BY 1, 2",
                    (list(schemas) if schemas else None, list(schemas) if schemas else None))
        for schema, table in cur.fetchall():
            if (schema, table) == ("trailbound", "run_outcome"):
                continue  # the failed run's own record (INFO shows the group ABENDED): meant to be written
            row = sql.SQL("(to_jsonb(t) - 'last_started')::text")
            cur.execute(sql.SQL("SELECT count(*), md5(coalesce(string_agg({row}, ',' ORDER BY {row}), '')) FROM {} t")
                        .format(sql.Identifier(schema, table), row=row))
            count, digest = cur.fetchone()
            digests[f"{schema}.{table}"] = f"{count} rows {digest}"
    return digests


def _files(home: Path) -> dict[str, str]:
    return {str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.rglob("*")) if p.is_file()}


def snapshot(pipeline: Pipeline) -> dict:
    """Checkpoints, catalog, trail listing, target rows and every file under home."""
    return {"metadata": _database_digest(pipeline.metadata_dsn, ("trailbound",)),
            "target": _database_digest(pipeline.target_dsn, None),
            "files": _files(pipeline.home)}


def changes(before: dict, after: dict) -> list[str]:
    found = []
    for part in before:
        keys = sorted(set(before[part]) | set(after[part]))
        found += [f"{part}: {key}" for key in keys if before[part].get(key) != after[part].get(key)]
    return found


# ------------------------------------------------------------------ damaging an archive

@dataclass(frozen=True)
class Expect:
    file: str
    rba: int | None
    message: str
    capture_path: bool = False  # the segment passes the scan; capture's own check refuses it


def _rewrite_data(archive: Archive, manifest: Path, data: bytes, *, honest: bool = True) -> None:
    """Replace a segment's data file; with `honest`, the manifest describes the new bytes."""
    document = json.loads(manifest.read_text())
    path = manifest.with_suffix("." + document["format"])
    path.write_bytes(data)
    if honest:
        document.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        manifest.write_text(json.dumps(document))


def _jsonl_with_line(archive: Archive, line_index: int, line: bytes) -> Path:
    """Segment 2 in JSON Lines with one line replaced by raw bytes (manifest honest)."""
    manifest = archive.segment(THREAD, [ins(110, "B", 10), ins(111, "B", 11), rec(120, "B", "COMMIT")], 200,
                               fmt="jsonl")
    lines = manifest.with_suffix(".jsonl").read_bytes().splitlines(keepends=True)
    lines[line_index] = line
    _rewrite_data(archive, manifest, b"".join(lines))
    return manifest


def _segment(records, fmt="parquet", **kwargs) -> Callable[[Archive], Path]:
    return lambda archive: archive.segment(THREAD, records, 200, fmt=fmt, **kwargs)


def _update(scn, xid, before, after) -> dict:
    return {"scn": scn, "ts": rec(scn, xid, "UPDATE")["ts"], "xid": xid, "parent_xid": None, "op": "UPDATE",
            "table": "shop.orders", "before": before, "after": after}


def sha256_mismatch(archive):
    _segment(good_records(), manifest_overrides={"sha256": "f" * 64})(archive)
    return Expect(f"{SEGMENT_2}.parquet", None, "the manifest says ffff")


def manifest_lies_about_bytes(archive):
    manifest = archive.segment(THREAD, good_records(), 200)
    size = manifest.with_suffix(".parquet").stat().st_size
    document = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(document | {"bytes": size + 7}))
    return Expect(f"{SEGMENT_2}.parquet", None, f"size is {size} bytes, the manifest says {size + 7}")


def manifest_lies_about_records_more(archive):
    _segment(good_records(), fmt="jsonl", manifest_overrides={"records": 3})(archive)
    return Expect(f"{SEGMENT_2}.jsonl", 2, "holds 2 records, the manifest says 3")


def manifest_lies_about_records_fewer(archive):
    _segment(good_records(), manifest_overrides={"records": 1})(archive)
    return Expect(f"{SEGMENT_2}.parquet", 1, "holds 2 records, the manifest says 1")


def manifest_records_past_the_position_limit(archive):
    """An rba must fit 32 bits (capture packs a log position into one long)."""
    _segment(good_records(), manifest_overrides={"records": 2**32})(archive)
    return Expect(f"{SEGMENT_2}.json", None, "records 4294967296 is over 4,294,967,295")


def manifest_lies_about_sha256_of_other_bytes(archive):
    """The data file replaced after the manifest was written (same size, other bytes)."""
    manifest = archive.segment(THREAD, [ins(110, "B", 10), rec(120, "B", "COMMIT")], 200, fmt="jsonl")
    data = manifest.with_suffix(".jsonl")
    data.write_bytes(data.read_bytes().replace(b'n10', b'nX0'))
    return Expect(f"{SEGMENT_2}.jsonl", None, "sha256 is ")


def unreadable_manifest(archive):
    manifest = archive.segment(THREAD, good_records(), 200)
    manifest.write_text('{"thread": 1, "sequence": 2,')
    return Expect(f"{SEGMENT_2}.json", None, "unreadable manifest")


def duplicate_manifest(archive):
    """Segment 2's manifest also saved under segment 3's name."""
    manifest = archive.segment(THREAD, good_records(), 200)
    shutil.copyfile(manifest, manifest.with_name("arch_1_000000003.json"))
    return Expect("arch_1_000000003.json", None, "manifest says thread 1 sequence 2, its name says otherwise")


def data_file_missing(archive):
    manifest = archive.segment(THREAD, good_records(), 200)
    manifest.with_suffix(".parquet").unlink()
    return Expect(f"{SEGMENT_2}.parquet", None, f"data file of {SEGMENT_2}.json is missing")


def sequence_gap(archive):
    archive.next_sequence[THREAD] = 3
    archive.segment(THREAD, good_records(), 200)
    return Expect("arch_1_000000003.json", None, "sequence gap: thread 1 goes from sequence 1 to 3 (missing 2)")


def first_scn_not_previous_next_scn(archive):
    archive.next_scn[THREAD] = 105
    archive.segment(THREAD, good_records(), 200)
    return Expect(f"{SEGMENT_2}.json", 0, "first_scn 105 does not equal next_scn 100 of sequence 1")


def segment_after_closed(archive):
    archive.segment(THREAD, good_records(), 200, closed=True)
    archive.segment(THREAD, [ins(210, "C", 20), rec(220, "C", "COMMIT")], 300)
    return Expect("arch_1_000000003.json", None, "thread 1 was closed by sequence 2, yet sequence 3 follows")


def truncated_parquet(archive):
    manifest = archive.segment(THREAD, good_records(), 200)
    data = manifest.with_suffix(".parquet").read_bytes()
    _rewrite_data(archive, manifest, data[:len(data) // 2])
    return Expect(f"{SEGMENT_2}.parquet", None, "not a readable Parquet file")


def cataloged_segment_damaged_afterwards(archive):
    """Segment 1, cataloged and captured, still holds OPEN's start; its data file is cut
    short afterwards (a disk, a tool writing where it should not). The catalog's checks
    are behind it: the Spark task that reads it again must name it."""
    archive.segment(THREAD, good_records(), 200)
    data_file = archive.root / "arch_1_000000001.parquet"
    data = data_file.read_bytes()
    data_file.write_bytes(data[:len(data) // 2])
    return Expect("arch_1_000000001.parquet", None, "cannot read it", capture_path=True)


def parquet_column_of_the_wrong_type(archive):
    manifest = archive.segment(THREAD, good_records(), 200)
    table = pq.read_table(manifest.with_suffix(".parquet"))
    table = table.set_column(1, "scn", pa.array([str(v) for v in table.column("scn").to_pylist()]))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    _rewrite_data(archive, manifest, sink.getvalue().to_pybytes())
    return Expect(f"{SEGMENT_2}.parquet", None, "column scn has type string")


def rba_gap(archive):
    _segment([ins(110, "B", 10), ins(111, "B", 11) | {"rba": 1}, rec(120, "B", "COMMIT", ) | {"rba": 3}])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 3, "rba gap: rba 3 follows rba 1")


def rba_not_from_zero(archive):
    _segment([ins(110, "B", 10) | {"rba": 1}, rec(120, "B", "COMMIT") | {"rba": 2}], fmt="jsonl")(archive)
    return Expect(f"{SEGMENT_2}.jsonl", 1, "rba gap: the segment starts at rba 1, not 0")


def rba_twice(archive):
    _segment([ins(110, "B", 10), ins(111, "B", 11) | {"rba": 0}, rec(120, "B", "COMMIT") | {"rba": 1}])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 0, "rba 0 appears twice")


def scn_backwards(archive):
    _segment([ins(110, "B", 10), ins(105, "B", 11), rec(120, "B", "COMMIT")], fmt="jsonl")(archive)
    return Expect(f"{SEGMENT_2}.jsonl", 1, "scn goes backwards: 105 after 110")


def scn_outside_the_segment(archive):
    _segment([ins(110, "B", 10), ins(250, "B", 11)])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 1, "scn 250 is outside the segment's range [100, 200)")


def unknown_op(archive):
    _segment([ins(110, "B", 10), rec(111, "B", "MERGE", "shop.orders", key=11), rec(120, "B", "COMMIT")],
             fmt="jsonl")(archive)
    return Expect(f"{SEGMENT_2}.jsonl", 1, "unknown op MERGE")


def lower_case_op(archive):
    _segment([ins(110, "B", 10) | {"op": "insert"}, rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 0, "unknown op insert")


def dml_without_table(archive):
    _segment([ins(110, "B", 10), rec(111, "B", "DELETE", None, key=10), rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 1, "DELETE without a table")


def commit_of_a_subtransaction(archive):
    _segment([ins(110, "B", 10), ins(111, "B.SP", 11, parent_xid="B"), rec(112, "B.SP", "COMMIT", parent_xid="B"),
              rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 2, "COMMIT of subtransaction B.SP (of transaction B)")


def record_after_commit(archive):
    _segment([ins(110, "B", 10), rec(115, "B", "COMMIT"), ins(116, "B", 11)])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 2, "record of transaction B after its COMMIT at sequence 2 rba 1")


def record_after_rollback(archive):
    _segment([ins(110, "B", 10), rec(115, "B", "ROLLBACK"), ins(116, "B", 11)], fmt="jsonl")(archive)
    return Expect(f"{SEGMENT_2}.jsonl", 2, "record of transaction B after its ROLLBACK at sequence 2 rba 1")


def subtransaction_record_after_its_parent_committed(archive):
    _segment([ins(110, "B", 10), ins(111, "B.SP", 11, parent_xid="B"), rec(115, "B", "COMMIT"),
              ins(116, "B.SP", 12, parent_xid="B")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 3, "record of subtransaction B.SP after its transaction B ended")


def parent_xid_names_a_subtransaction(archive):
    _segment([ins(110, "B", 10), ins(111, "B.SP1", 11, parent_xid="B"), ins(112, "B.SP2", 12, parent_xid="B.SP1"),
              rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 2, "parent_xid B.SP1 of B.SP2 names a subtransaction (of transaction B)")


def parent_xid_names_an_earlier_segments_subtransaction(archive):
    """OPEN.SP is a savepoint of OPEN in segment 1, already cataloged: the scan of segment
    2 alone cannot tell; capture, which re-reads OPEN from its start, must."""
    _segment([ins(110, "OPEN.SP2", 12, parent_xid="OPEN.SP"), ins(111, "B", 10), rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 0, "parent_xid OPEN.SP of OPEN.SP2 names a subtransaction",
                  capture_path=True)


def parent_xid_names_itself(archive):
    _segment([ins(110, "B", 10), ins(111, "S", 11, parent_xid="S"), rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 1, "parent_xid of S names itself")


def xid_over_128_characters(archive):
    xid = "x" * 129
    _segment([ins(110, xid, 10), rec(120, xid, "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 0, "xid must be 1 to 128 characters")


def empty_xid(archive):
    _segment([ins(110, "B", 10), ins(111, "", 11), rec(120, "B", "COMMIT")], fmt="jsonl")(archive)
    return Expect(f"{SEGMENT_2}.jsonl", 1, "xid must be 1 to 128 characters")


def ts_not_a_time(archive):
    manifest = _jsonl_with_line(archive, 1, b'{"rba":1,"scn":111,"ts":"yesterday","xid":"B","parent_xid":null,'
                                            b'"op":"INSERT","table":"shop.orders","before":null,'
                                            b'"after":"{\\"id\\":11}"}\n')
    return Expect(f"{SEGMENT_2}.jsonl", 1, "record without a valid ts")


def json_line_that_does_not_parse(archive):
    _jsonl_with_line(archive, 1, b'{"rba":1,"scn":111,"ts":"2026-11-01T00:01:51Z","xid":"B",oops\n')
    return Expect(f"{SEGMENT_2}.jsonl", 1, "line 2 is not well-formed JSON")


def json_line_that_is_not_an_object(archive):
    _jsonl_with_line(archive, 2, b'"COMMIT"\n')
    return Expect(f"{SEGMENT_2}.jsonl", 2, "line 3 is not a JSON object")


def non_utf8_bytes(archive):
    _jsonl_with_line(archive, 1, b'{"rba":1,"scn":111,"ts":"2026-11-01T00:01:51Z","xid":"B","parent_xid":null,'
                                 b'"op":"INSERT","table":"shop.orders","before":null,'
                                 b'"after":"{\\"id\\":11,\\"note\\":\\"caf\xe9\\"}"}\n')
    return Expect(f"{SEGMENT_2}.jsonl", 1, "line 2 is not valid UTF-8")


def before_is_a_json_string(archive):
    _segment([ins(110, "B", 10), _update(111, "B", json.dumps("id=10"), {"id": 10, "note": "x"}),
              rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 1, "before is not a JSON object")


def after_is_a_json_array(archive):
    _segment([ins(110, "B", 10) | {"after": "[10, \"n\"]"}, rec(120, "B", "COMMIT")], fmt="jsonl")(archive)
    return Expect(f"{SEGMENT_2}.jsonl", 0, "after is not a JSON object")


def after_is_not_json(archive):
    _segment([ins(110, "B", 10) | {"after": "{id: 10}"}, rec(120, "B", "COMMIT")])(archive)
    return Expect(f"{SEGMENT_2}.parquet", 0, "after is not a JSON object")


ARCHIVE_CASES = [
    sha256_mismatch, manifest_lies_about_bytes, manifest_lies_about_records_more, manifest_lies_about_records_fewer,
    manifest_records_past_the_position_limit, manifest_lies_about_sha256_of_other_bytes, unreadable_manifest,
    duplicate_manifest, data_file_missing,
    sequence_gap, first_scn_not_previous_next_scn, segment_after_closed, truncated_parquet,
    cataloged_segment_damaged_afterwards,
    parquet_column_of_the_wrong_type, rba_gap, rba_not_from_zero, rba_twice, scn_backwards, scn_outside_the_segment,
    unknown_op, lower_case_op, dml_without_table, commit_of_a_subtransaction, record_after_commit,
    record_after_rollback, subtransaction_record_after_its_parent_committed, parent_xid_names_a_subtransaction,
    parent_xid_names_an_earlier_segments_subtransaction, parent_xid_names_itself, xid_over_128_characters,
    empty_xid, ts_not_a_time, json_line_that_does_not_parse, json_line_that_is_not_an_object, non_utf8_bytes,
    before_is_a_json_string, after_is_a_json_array, after_is_not_json,
]


# ------------------------------------------------------------------ damaging a trail file

def _rewrite_trail(path: Path, change: Callable[[pa.Table, dict], tuple[pa.Table, dict]]) -> None:
    """Write a trail file again with changed records and/or footer, keeping it a valid
    Parquet file (so only trailbound's own checks can notice)."""
    raw = pq.read_table(path)
    meta = json.loads(raw.schema.metadata[b"trailbound.trail"])
    table, meta = change(raw.replace_schema_metadata(None), meta)
    # The footer's other keys (a version 4 file's copy-line layouts) stay as they were.
    footer = raw.schema.metadata | {b"trailbound.trail": json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(footer), path,
                   compression="zstd", write_page_checksum=True)


def truncated_trail(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def empty_trail(path):
    path.write_bytes(b"")


def flipped_byte_in_a_page(path):
    """One bit of the `after` column's last data page payload (covered by its CRC)."""
    metadata = pq.ParquetFile(path).metadata
    column = metadata.row_group(0).column(trail.COLUMNS.index("after"))
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + column.total_compressed_size - 3] ^= 0x40
    path.write_bytes(bytes(data))


def flipped_byte_in_the_footer(path):
    data = bytearray(path.read_bytes())
    data[-12] ^= 0x01
    path.write_bytes(bytes(data))


def missing_file(path):
    path.unlink()


def footer_says_more_records(path):
    _rewrite_trail(path, lambda table, meta: (table, meta | {"records": meta["records"] + 1}))


def footer_content_digest_wrong(path):
    _rewrite_trail(path, lambda table, meta: (table, meta | {"content_sha256": "0" * 64}))


def footer_of_another_seqno(path):
    _rewrite_trail(path, lambda table, meta: (table, meta | {"seqno": meta["seqno"] + 1}))


def footer_of_a_future_format(path):
    _rewrite_trail(path, lambda table, meta: (table, meta | {"format_version": trail.FORMAT_VERSION + 1}))


def footer_missing(path):
    table = pq.read_table(path).replace_schema_metadata(None)
    pq.write_table(table, path)


def record_changed_footer_kept(path):
    def change(table, meta):
        after = table.column("after").to_pylist()
        after[0] = after[0].replace("n", "m", 1)
        return table.set_column(table.schema.get_field_index("after"), "after", pa.array(after, pa.string())), meta
    _rewrite_trail(path, change)


def record_changed_footer_recomputed(path):
    """A rewritten file that is valid on its own: only the recorded file SHA-256 can tell."""
    table = trail.read_file(path)
    after = table.column("after").to_pylist()
    after[0] = after[0].replace("n", "m", 1)
    table = table.set_column(table.schema.get_field_index("after"), "after", pa.array(after, pa.string()))
    seqno = int(path.name[-9:])
    trail.write_file(path.with_name(path.name[:-9]), seqno, table, group="EXT1",
                     log_bsn=Scn(table.column("log_bsn")[0].as_py()))


def rba_gap_footer_recomputed(path):
    table = trail.read_file(path)
    table = table.set_column(0, "rba", pa.array([r + 1 for r in table.column("rba").to_pylist()], pa.int64()))
    trail.write_file(path.with_name(path.name[:-9]), int(path.name[-9:]), table, group="EXT1",
                     log_bsn=Scn(table.column("log_bsn")[0].as_py()))


def not_a_trail_file(path):
    path.write_text("this is not a trail file\n")


# (damage, what logdump must say, the rba it must name). Pump and replicat check the
# whole file's SHA-256 as committed before they decode anything, so for them every case
# is "does not match the recorded" (or "not there") at rba 0; logdump reads the file
# alone and must find each defect by the file's own checks.
TRAIL_CASES = [
    (truncated_trail, "not a readable trail file", 0),
    (empty_trail, "not a readable trail file", 0),
    (flipped_byte_in_a_page, "damaged trail file", 0),
    (flipped_byte_in_the_footer, "not a readable trail file", 0),
    (missing_file, "not a readable trail file", 0),
    (footer_says_more_records, "holds 1 records, its metadata says 2", 1),
    (footer_content_digest_wrong, "content checksum does not match its metadata", 0),
    (footer_of_another_seqno, "its footer says trail seqno 3, its name 2", 0),
    (footer_of_a_future_format, f"trail format version {trail.FORMAT_VERSION + 1} is not", 0),
    (footer_missing, "not a trailbound trail file (no trail metadata)", 0),
    (record_changed_footer_kept, "content checksum does not match its metadata", 0),
    (record_changed_footer_recomputed, None, None),  # valid on its own: only the recorded SHA-256 tells
    (rba_gap_footer_recomputed, "record 0 carries rba 1", 0),
    (not_a_trail_file, "not a readable trail file", 0),
]
