"""Helpers for pump and trail-purge tests: a configuration with pumps, source trails
written file by file (committed the way capture commits them), reading a committed
trail back, and reader positions set the way a replicat sets its own."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pyarrow as pa

from capture_kit import T0
from trailbound import config as configuration
from trailbound.positions import Scn
from trailbound.trail import format as trail
from trailbound import files as trailfs


def write_config(tmp_path: Path, pumps: dict[str, dict], *, purge: dict | None = None,
                 extract_tables=("shop.*", "hr.*"), megabytes: float = 64,
                 replicats: dict[str, dict] | None = None) -> Path:
    """A configuration with source SRC, extract EXT1 writing dirdat/lt, `pumps` and
    `replicats` (name -> options, written as YAML flow mappings)."""
    lines = [f"home: {tmp_path}", "sources:", "  SRC:", "    altarchivelogdest: archive", "extracts:", "  EXT1:",
             "    source: SRC", "    exttrail: dirdat/lt", f"    table: {json.dumps(list(extract_tables))}",
             f"    megabytes: {megabytes}"]
    if pumps:
        lines.append("pumps:")
        lines += [f"  {name}: {json.dumps(options)}" for name, options in pumps.items()]
    if replicats:
        lines.append("replicats:")
        lines += [f"  {name}: {json.dumps(options)}" for name, options in replicats.items()]
    if purge is not None:
        lines.append(f"purgeoldextracts: {json.dumps(purge)}")
    path = tmp_path / "trailbound.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def load(tmp_path: Path, pumps: dict[str, dict], **kwargs) -> configuration.Config:
    return configuration.load(write_config(tmp_path, pumps, **kwargs))


def records_of(transactions: list[tuple[str, list[tuple]]], scn: int) -> tuple[list[dict], int]:
    """Trail records for `transactions`, each (xid, [(table, key) or (table, key, note)]),
    every change an INSERT; commit SCNs go up by 10 from `scn`. Returns the records and
    the last SCN used."""
    rows = []
    for xid, changes in transactions:
        scn += 10
        for index, change in enumerate(changes):
            table, key, note = (*change, f"n{change[1]}")[:3]
            single, first, last = len(changes) == 1, index == 0, index == len(changes) - 1
            indicator = trail.WHOLE if single else trail.BEGIN if first else trail.END if last else trail.MIDDLE
            rows.append({"rba": len(rows), "trans_ind": indicator, "csn": scn, "csn_thread": 1, "csn_sequence": 1,
                         "csn_rba": scn, "xid": xid, "commit_ts": T0 + timedelta(seconds=scn), "op": "INSERT",
                         "table": table, "before": None, "after": json.dumps({"id": key, "note": note}),
                         "src_thread": 1, "src_sequence": 1, "src_rba": scn - len(changes) + index,
                         "src_scn": scn - 1, "log_bsn": 50})
    return rows, scn


class SourceTrail:
    """A local trail written one file at a time and committed the way capture commits
    its files (a trail_file row with the whole file's SHA-256)."""

    def __init__(self, store, prefix: Path, group: str = "EXT1"):
        self.store, self.prefix, self.group = store, prefix, group
        self.seqno = 0
        self.scn = 100

    def add_file(self, transactions: list[tuple[str, list[tuple]]], *, commit: bool = True) -> trail.TrailFileInfo:
        rows, self.scn = records_of(transactions, self.scn)
        self.seqno += 1
        info = trail.write_file(self.prefix, self.seqno, pa.Table.from_pylist(rows, trail.SCHEMA), group=self.group,
                                log_bsn=Scn(50))
        if commit:
            self.commit(info)
        return info

    def commit(self, info: trail.TrailFileInfo) -> None:
        with self.store.transaction() as cur:
            cur.execute("INSERT INTO trailbound.trail_file (trail, seqno, path, records, bytes, sha256, first_csn,"
                        " last_csn, log_bsn, written_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (str(self.prefix), info.seqno, str(info.path), info.records, info.bytes, info.sha256,
                         str(info.first_csn), str(info.last_csn), info.log_bsn.value, self.group))


def committed_files(store, trail_key: str) -> list[dict]:
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.trail_file WHERE trail = %s ORDER BY seqno", (trail_key,))
        return cur.fetchall()


def read_trail(store, trail_key: str, spark=None, *, from_seqno: int = 1) -> list[dict]:
    """Every record of a committed trail, in order, each file checked against its
    recorded SHA-256 the way replicat reads (a damaged file raises TrailError)."""
    records = []
    for row in committed_files(store, trail_key):
        if row["seqno"] < from_seqno or row["purged_at"] is not None:
            continue
        fs = trailfs.for_location(row["path"], spark)
        for record in trail.read_file(row["path"], fs=fs, sha256=row["sha256"]).to_pylist():
            records.append(record | {"seqno": row["seqno"]})
    return records


def changes(records: list[dict]) -> list[tuple]:
    """A trail as (xid, trans_ind, table, key) per record: what a replicat would apply."""
    return [(r["xid"], r["trans_ind"], r["table"], json.loads(r["after"])["id"]) for r in records]


def set_reader(store, trail_key: str, kind: str, group: str, seqno: int, rba: int) -> None:
    """A reader's position, upserted as a replicat does in its checkpoint transaction."""
    with store.transaction() as cur:
        cur.execute("INSERT INTO trailbound.trail_reader (trail, reader_kind, group_name, seqno, rba)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (trail, reader_kind, group_name)"
                    " DO UPDATE SET seqno = EXCLUDED.seqno, rba = EXCLUDED.rba, updated_at = now()",
                    (trail_key, kind, group, seqno, rba))


def pump_state(store, group: str = "PMP1"):
    from trailbound.pump.checkpoints import load

    with store.transaction() as cur:
        return load(cur, group)
