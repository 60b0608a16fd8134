"""`trailbound logdump TRAILFILE`: print a trail file's records (GoldenGate's Logdump)."""

from __future__ import annotations

from datetime import timezone
from pathlib import Path

from trailbound.cli.context import Context, non_negative, verb
from trailbound.errors import TrailboundError


def logdump(ctx: Context) -> int:
    import json as _json

    from trailbound.positions import Csn
    from trailbound.trail import format as trail

    path = Path(ctx.args.file)
    if not path.exists() and "://" not in ctx.args.file and (purged := _purged(ctx, path)):
        raise TrailboundError(purged)
    seqno = int(path.name[-9:]) if path.name[-9:].isdigit() else None
    records = trail.read_file(path).num_rows
    if ctx.args.from_rba >= max(records, 1):
        raise TrailboundError(f"{path}: --from {ctx.args.from_rba} is past the file's end: it holds {records} "
                              f"record(s), rba 0..{records - 1}" if records else f"{path}: the file holds no record")
    for record in trail.iter_records(path, ctx.args.from_rba, ctx.args.count):
        csn = Csn.from_row(record)
        fields = {"seqno": seqno, "rba": record["rba"], "trans_ind": record["trans_ind"], "csn": str(csn),
                  "xid": record["xid"], "commit_ts": record["commit_ts"].isoformat(), "op": record["op"],
                  "table": record["table"], "table_version": record["table_version"], "before": record["before"],
                  "after": record["after"]}
        if ctx.args.json:
            print(_json.dumps(fields, ensure_ascii=False))
        else:
            position = f"{seqno}:{record['rba']}" if seqno is not None else f"rba {record['rba']}"
            print(f"{position:>14}  ind {record['trans_ind']}  csn {csn}  commit "
                  f"{record['commit_ts'].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S.%f} UTC  xid {record['xid']!r}  "
                  f"{record['op']:<8} {_table(record)}  before={record['before']}  after={record['after']}")
    return 0


def _table(record: dict) -> str:
    """The table and the version of its definition the record was written under (v1 for
    a file older than versions)."""
    if record["table"] is None:
        return "None"
    return f"{record['table']} v{record['table_version'] or 1}"


def _purged(ctx: Context, path: Path) -> str | None:
    """What to say of a file the trail purge deleted (when, and why), as the trail catalog
    remembers it; None when it was not purged (the read then says the file is not there)."""
    from trailbound.ggsci import utc
    from trailbound.trail import catalog

    try:
        with ctx.store.transaction() as cur:
            row = catalog.purged_file(cur, {str(path), str(path.absolute()), str(path.resolve())})
    except TrailboundError:
        return None  # no configuration or metadata store to ask
    if row is None:
        return None
    reason = f" ({row['reason']})" if row["reason"] else ""
    return (f"{path}: purged at {utc(row['purged_at'])} by the trail purge{reason}: seqno {row['seqno']} of trail "
            f"{row['trail']}, {row['records']} record(s), is gone from disk")


def arguments(verbs) -> None:
    dump = verb(verbs, "logdump", logdump, "print the records of a trail file")
    dump.add_argument("file")
    dump.add_argument("--from", dest="from_rba", type=non_negative, default=0, metavar="RBA",
                      help="the first record to print (0: the file's first)")
    dump.add_argument("--count", type=non_negative, help="at most this many records")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
