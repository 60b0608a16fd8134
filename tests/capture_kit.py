"""Helpers for capture tests: hand-written archives, a config for them, reading the
committed trail back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from trailbound import config as configuration
from trailbound.trail import catalog
from trailbound.trail import format as trail
from trailbound.archive.writer import write_defs, write_segment
from trailbound.positions import Scn
from trailbound.capture import checkpoints as ckpt

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
TABLES = [
    {"name": "shop.orders", "columns": [{"name": "id", "type": "bigint", "nullable": False},
                                        {"name": "note", "type": "text", "nullable": True}], "key": ["id"]},
    {"name": "hr.salaries", "columns": [{"name": "id", "type": "bigint", "nullable": False},
                                         {"name": "amount", "type": "numeric", "nullable": True}], "key": ["id"]},
]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def rec(scn: int, xid: str, op: str, table: str | None = None, *, key: int | None = None, parent_xid=None,
        note: str | None = None) -> dict:
    after = None if key is None or op == "DELETE" else {"id": key, "note": note if note is not None else f"n{key}"}
    before = {"id": key} if op in ("UPDATE", "DELETE") and key is not None else None
    return {"scn": scn, "ts": at(scn), "xid": xid, "parent_xid": parent_xid, "op": op, "table": table,
            "before": before, "after": after}


def ins(scn: int, xid: str, key: int, table: str = "shop.orders", parent_xid=None) -> dict:
    return rec(scn, xid, "INSERT", table, key=key, parent_xid=parent_xid)


@dataclass
class Archive:
    """Segments per thread written in order; each segment's scn range and time are its
    scn range in seconds after T0 (so `until=at(scn)` means "archived by then")."""

    root: Path
    next_sequence: dict[int, int] = field(default_factory=dict)
    next_scn: dict[int, int] = field(default_factory=dict)

    def segment(self, thread: int, records: list[dict], next_scn: int, *, fmt: str = "parquet",
                closed: bool = False, manifest_overrides: dict | None = None) -> Path:
        sequence = self.next_sequence.get(thread, 1)
        first = self.next_scn.get(thread, 0)
        path = write_segment(self.root, thread=thread, sequence=sequence, records=records, first_scn=Scn(first),
                             next_scn=Scn(next_scn), first_time=at(first), next_time=at(next_scn), fmt=fmt, closed=closed,
                             manifest_overrides=manifest_overrides)
        self.next_sequence[thread], self.next_scn[thread] = sequence + 1, next_scn
        return path


def new_archive(tmp_path: Path) -> Archive:
    root = tmp_path / "archive"
    write_defs(root, TABLES)
    return Archive(root)


def write_config(tmp_path: Path, tables=("shop.*",), megabytes: float = 64, begin: str = "earliest") -> Path:
    path = tmp_path / "trailbound.yaml"
    table_list = ", ".join(f'"{t}"' for t in tables)
    path.write_text(f"home: {tmp_path}\nsources:\n  SRC:\n    altarchivelogdest: archive\n"
                    f"extracts:\n  EXT1:\n    source: SRC\n    exttrail: dirdat/lt\n    table: [{table_list}]\n"
                    f"    megabytes: {megabytes}\n    begin: {begin}\n")
    return path


def load_config(tmp_path: Path, **kwargs) -> configuration.Config:
    return configuration.load(write_config(tmp_path, **kwargs))


def committed_trail(store, config) -> list[dict]:
    """Every record of the committed trail, in trail order, with its seqno."""
    prefix = config.path(config.extract("EXT1").exttrail)
    with store.transaction() as cur:
        files = catalog.committed_files(cur, str(prefix))
    records = []
    for row in files:
        for record in trail.iter_records(Path(row["path"])):
            records.append(record | {"seqno": row["seqno"]})
    return records


def transactions(records: list[dict]) -> list[tuple[str, list[int]]]:
    """The trail as (xid, [keys]) per transaction, in order."""
    out: list[tuple[str, list[int]]] = []
    import json

    for record in records:
        key = json.loads(record["after"] or record["before"])["id"]
        if record["trans_ind"] in (trail.BEGIN, trail.WHOLE):
            out.append((record["xid"], []))
        out[-1][1].append(key)
    return out


def state(store, group: str = "EXT1") -> ckpt.ExtractState:
    with store.transaction() as cur:
        return ckpt.load(cur, group)
