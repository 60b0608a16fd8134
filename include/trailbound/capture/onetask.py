"""Capture of a log whose transactions come whole and in commit order: one task, one pass.

A logical replication slot decodes each transaction at its commit and hands it over
whole (pgoutput without streaming): the archive `trailbound archive pull` writes is then
already in commit order, on one thread, each transaction's records together and ending
with its COMMIT. The general assembly (capture.assemble) groups a log's records by
transaction with a shuffle, rolls them up, joins them back and sorts them into files:
about 60 Spark CPU-seconds per million changes, two thirds of the live pipeline's
(docs/benchmarks/live-postgres.md). A log in that shape needs none of it: its trail is
its committed, captured records in the order they were read. So such a run is written by
one Spark task that reads the window twice: the narrow columns first (ids, operations,
positions), to check the shape and decide each transaction's fate; then every column, to
write the trail files as the records come (trail.format.write_planned_files, the same
files, rollover and checks as capture.trailwrite).

The shape is checked, never assumed. This path is taken only when no transaction is
skipped, forced or persisted (an open one is simply read again from its start, as every
run does) and the window's segments are Parquet files of one thread (`reason_not_to`),
and then only if the first pass finds every transaction's records together, ended but
the last (which stays open), without subtransactions, each xid used once. Otherwise nothing is written and the run goes through capture.assemble,
which writes the same trail (tests/test_capture_inorder.py compares them byte for byte)
and names any record that breaks the contract.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound.archive import contract
from trailbound.capture import logread
from trailbound.positions import Csn, Scn, csn_at_or_below
from trailbound.runcounts import count_ops
from trailbound.trail import format as trails

# The columns the first pass reads: enough to find each transaction and its fate.
_NARROW = ("rba", "scn", "ts", "xid", "parent_xid", "op", "table")
_END_OPS = pa.array(contract.END_OPS, pa.string())


def reason_not_to(segments, restored_files, window: logread.ReadWindow, open_transactions, directives) -> str | None:
    """Why a run cannot be written in one pass whatever its records are, or None."""
    if any(t.skip_reason or t.persisted for t in open_transactions):
        return "transactions skipped or persisted by an earlier run"
    if restored_files or window.held:
        return "persisted transactions to restore"
    if directives:
        return "skiptrans or forcetrans pending"
    if any(s.format != "parquet" for s in segments):
        return "JSON Lines segments"
    if len({s.thread for s in segments}) > 1:
        return "more than one thread"
    return None


@dataclass(frozen=True)
class Task:
    """What the one task needs: the log to read and the trail to write."""

    inputs: list                    # logread._Input of the window's segments, in log order
    window: logread.ReadWindow
    tables: list[str]               # the captured table patterns
    read_scn: int | None            # transactions that ended below it were decided earlier
    begin_scn: int                  # transactions that started below it are never written
    last_written: Csn | None        # the write checkpoint's CSN
    prefix: str
    first_seqno: int
    max_bytes: int
    group: str
    log_bsn: int
    layouts: dict
    versions: dict
    claim: str


@dataclass
class Written:
    """What the task did: `reason` (why it wrote nothing and the general path must run),
    else the files (dicts as capture.trailwrite's rows, with their transaction counts and
    op counts), what was read (capture.assemble's log_reads row for the thread, or None)
    and the transaction left open at the horizon (an open-transactions row as the general
    path's, or None)."""

    reason: str | None
    files: list[dict]
    read: dict | None
    open: dict | None = None


def write(task: Task) -> Written:
    """Runs in a Spark task (trailbound.spark.run_tasks)."""
    try:
        shape = _first_pass(task)
    except Exception as exc:  # an unreadable file: the general path reads it again and names it
        return Written(f"first pass failed: {' '.join(str(exc).split())}", [], None)
    if isinstance(shape, str):
        return Written(shape, [], None)
    if shape is None:
        return Written(None, [], None)
    files = _second_pass(task, shape)
    pa.default_memory_pool().release_unused()  # the worker stays for the run's next tasks
    return Written(None, files, shape.read, shape.open)


def check_or_write(item: tuple[str, object]):
    """A task of a run's one job: ("check", segments) checks a run of new segments
    (archive.segments.check_run), ("write", Task) writes the trail (`write`)."""
    from trailbound.archive import segments

    kind, what = item
    return segments.check_run(what) if kind == "check" else write(what)


@dataclass
class _Shape:
    """The first pass's findings: per record of the window (in read order), its packed
    position and its transaction's ordinal; per transaction (in log order = commit
    order), its end (CSN columns, time) and whether it goes to the trail."""

    at: np.ndarray
    ordinal: np.ndarray
    csn: np.ndarray
    csn_sequence: np.ndarray
    csn_rba: np.ndarray
    commit_ts: pa.Array
    written: np.ndarray
    thread: int
    read: dict
    open: dict | None   # the transaction open at the horizon (its size is added by the second pass)


def _narrow_parts(task: Task):
    """The window's records, narrow columns only, about a part at a time per file."""
    import pyarrow.parquet as pq

    for item in task.inputs:
        parquet = pq.ParquetFile(item.path)
        columns = [c for c in _NARROW if c in parquet.schema_arrow.names]
        for batch in parquet.iter_batches(batch_size=logread._RECORDS_PER_PART, columns=columns, use_threads=False):
            table = pa.Table.from_batches([batch])
            if "parent_xid" not in table.column_names:
                table = table.append_column("parent_xid", pa.nulls(len(table), pa.string()))
            table = logread._cast(table, _NARROW)
            n = len(table)
            table = table.append_column("thread", pa.repeat(pa.scalar(item.thread, pa.int32()), n))
            table = table.append_column("sequence", pa.repeat(pa.scalar(item.sequence, pa.int64()), n))
            table = table.append_column("txid", table["xid"]).append_column("restored", pa.repeat(False, n))
            table = table.filter(task.window.keep(table))
            if len(table):
                yield table


def _first_pass(task: Task) -> _Shape | str | None:
    """The shape of the window's log, or why it is not in commit order (a str), or None
    when the window holds no record."""
    captured = logread._captured_matcher(task.tables)
    ats, ordinals, kept_ordinals, starts, ends = [], [], [], [], []
    previous_xid, previous_ended, transactions = None, True, 0
    n = reread = 0
    last_start = last_start_at = None  # the latest transaction's first record, and its index
    first = last = from_time = None
    thread = None
    for part in _narrow_parts(task):
        m = len(part)
        xid, op = part["xid"].combine_chunks(), part["op"]
        at = logread.packed(part["sequence"], part["rba"]).to_numpy()
        if part["parent_xid"].null_count != m:
            row = int(np.flatnonzero(pc.is_valid(part["parent_xid"]).to_numpy(zero_copy_only=False))[0])
            return _at(part, row, "a subtransaction (parent_xid)")
        changed = np.empty(m, dtype=bool)
        changed[0] = previous_xid is None or xid[0].as_py() != previous_xid
        changed[1:] = pc.not_equal(xid.slice(1), xid.slice(0, m - 1)).to_numpy(zero_copy_only=False)
        ended = pc.is_in(op, value_set=_END_OPS).to_numpy(zero_copy_only=False)
        ended_before = np.concatenate([[previous_ended], ended[:-1]])
        if not np.array_equal(changed, ended_before):
            at_row = int(np.argmax(changed != ended_before))
            return _at(part, at_row, "transactions interleave" if changed[at_row] else "a record after its end")
        ordinal = np.cumsum(changed) - 1 + transactions
        transactions += int(changed.sum())
        ats.append(at)
        ordinals.append(ordinal)
        kept_ordinals.append(ordinal[captured(part).to_numpy(zero_copy_only=False)])
        if changed.any():
            starts.append(part["scn"].to_numpy()[changed])
            row = int(np.flatnonzero(changed)[-1])
            last_start, last_start_at = _record(part, row), n + row
        ends.append(part.filter(pa.array(ended)).select(["xid", "scn", "sequence", "rba", "ts", "op"]))
        previous_xid, previous_ended = xid[m - 1].as_py(), bool(ended[-1])
        thread = part["thread"][0].as_py()
        n += m
        if task.read_scn is not None:
            reread += int(pc.sum(pc.less(part["scn"], task.read_scn)).as_py() or 0)
        earliest = pc.min(part["ts"]).as_py()
        from_time = earliest if from_time is None else min(from_time, earliest)
        if first is None:
            first = _record(part, 0)
        last = _record(part, m - 1)
    if not n:
        return None
    open_row = None
    if not previous_ended:
        if last_start["scn"] < task.begin_scn:
            return f"transaction {previous_xid} in flight at the begin point"
        open_row = {"thread": thread, "txid": previous_xid, "start": last_start, "end": None,
                    "records": n - last_start_at, "bytes": 0, "skip_reason": None, "forced": False}
    ends = pa.concat_tables(ends)
    if len(pc.unique(ends["xid"])) != len(ends):
        return "an xid used by more than one transaction"
    csn, sequence, rba = (ends[c].to_numpy() for c in ("scn", "sequence", "rba"))
    if np.any(np.diff(csn) < 0):
        return "commit SCNs out of log order"  # the trail's order would not be the log's
    start_scn = np.concatenate(starts)[:len(ends)]
    kept = np.bincount(np.concatenate(kept_ordinals), minlength=transactions)[:len(ends)]
    written = (pc.equal(ends["op"], "COMMIT").to_numpy(zero_copy_only=False) & (start_scn >= task.begin_scn)
               & (kept > 0))
    if task.read_scn is not None:
        written &= csn >= task.read_scn
    if task.last_written is not None:
        written &= ~csn_at_or_below([csn, np.full(len(csn), thread), sequence, rba], task.last_written)
    read = {"thread": thread, "n": n, "reread": reread, "from_time": from_time, "first": first, "last": last}
    written = np.concatenate([written, np.zeros(transactions - len(ends), dtype=bool)])  # the open one, if any
    return _Shape(np.concatenate(ats), np.concatenate(ordinals), csn, sequence, rba, ends["ts"].combine_chunks(),
                  written, thread, read, open_row)


def _at(part: pa.Table, row: int, what: str) -> str:
    return (f"{what} at sequence {part['sequence'][row].as_py()} rba {part['rba'][row].as_py()} "
            f"(xid {part['xid'][row].as_py()})")


def _record(part: pa.Table, row: int) -> dict:
    return {name: part[name][row].as_py() for name in ("sequence", "rba", "scn", "ts")}


def _octets(column) -> np.ndarray:
    return logread._octets(column).to_numpy()


def _second_pass(task: Task, shape: _Shape) -> list[dict]:
    """Every column of the window's records again; the captured records of the written
    transactions, with their CSNs and file numbers, into trail files."""
    files: list[dict] = []
    per_file: dict[int, dict] = {}
    rollover = {"file": 0, "bytes": 0, "transaction": -1}

    def batches():
        captured = logread._captured_matcher(task.tables)
        offset = 0
        for part in logread._read_parts(task.inputs, task.window):
            m = len(part)
            at = logread.packed(part["sequence"], part["rba"]).to_numpy()
            if not np.array_equal(at, shape.at[offset:offset + m]):
                raise RuntimeError("the second pass read other records than the first")  # files are immutable
            ordinal = shape.ordinal[offset:offset + m]
            offset += m
            if shape.open is not None:  # its size as the general path counts it: the images' bytes
                its = ordinal == len(shape.csn)
                if its.any():
                    shape.open["bytes"] += int((_octets(part["before"]) + _octets(part["after"]))[its].sum())
            keep = shape.written[ordinal] & captured(part).to_numpy(zero_copy_only=False)
            if not keep.any():
                continue
            part, ordinal = part.filter(pa.array(keep)), ordinal[keep]
            # A record's size as capture.logread's summaries count it (the trail's Arrow bytes).
            row_bytes = trails.FIXED_ROW_BYTES + sum(_octets(part[c]) for c in ("txid", "op", "table", "before",
                                                                                "after"))
            numbers = _file_numbers(ordinal, row_bytes, rollover, task.max_bytes, per_file)
            k = len(part)
            batch = pa.table({
                "csn": shape.csn[ordinal], "csn_thread": pa.repeat(pa.scalar(shape.thread, pa.int32()), k),
                "csn_sequence": shape.csn_sequence[ordinal], "csn_rba": shape.csn_rba[ordinal],
                "xid": part["txid"], "commit_ts": shape.commit_ts.take(pa.array(ordinal)), "op": part["op"],
                "table": part["table"], "before": part["before"], "after": part["after"],
                "src_thread": part["thread"], "src_sequence": part["sequence"], "src_rba": part["rba"],
                "src_scn": part["scn"], "log_bsn": pa.repeat(pa.scalar(task.log_bsn, pa.int64()), k),
                "file_no": pa.array(numbers, pa.int64())})
            for number, table, op, count in count_ops(batch, keys=("file_no",)):
                per_file[number]["op_counts"].append([table, op, count])
            yield from batch.to_batches()
        if offset != len(shape.at):
            raise RuntimeError("the second pass read fewer records than the first")

    for info in trails.write_planned_files(Path(task.prefix), task.first_seqno, batches(), group=task.group,
                                           log_bsn=Scn(task.log_bsn), layouts=task.layouts, versions=task.versions,
                                           claim=task.claim):
        number = info.seqno - task.first_seqno
        files.append({
            "file_no": number, "path": str(info.path), "records": info.records, "bytes": info.bytes,
            "sha256": info.sha256, "first_csn": str(info.first_csn), "last_csn": str(info.last_csn),
            "transactions": per_file[number]["transactions"],
            "op_counts": json.dumps(per_file[number]["op_counts"])})
    return files


def _file_numbers(ordinal: np.ndarray, row_bytes: np.ndarray, rollover: dict, max_bytes: int,
                  per_file: dict) -> np.ndarray:
    """Each record's file number: trail.format.plan_rollover's cut (a file takes
    transactions until one brings it to `max_bytes` or more), made as the records come;
    `rollover` carries the current file, its bytes and transaction across parts."""
    if not len(ordinal):
        return np.empty(0, dtype=np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(ordinal)) + 1])
    sizes = np.add.reduceat(row_bytes, starts)
    first = 0
    if int(ordinal[0]) == rollover["transaction"]:  # the part goes on with the current transaction
        rollover["bytes"] += int(sizes[0])
        first = 1
    # The current file so far as one transaction ahead of the part's new ones: plan_rollover
    # then cuts them as it would have cut the whole run.
    files = trails.plan_rollover(np.concatenate([[rollover["bytes"]], sizes[first:]]), max_bytes) + rollover["file"]
    per_transaction = np.concatenate([[rollover["file"]] * first, files[1:]]).astype(np.int64)
    for number, count in zip(*np.unique(files[1:], return_counts=True)):
        per_file.setdefault(int(number), {"transactions": 0, "op_counts": []})["transactions"] += int(count)
    last = int(files[-1])
    rollover["file"] = last
    rollover["bytes"] = int(np.concatenate([[rollover["bytes"]], sizes[first:]])[files == last].sum())
    rollover["transaction"] = int(ordinal[-1])
    return np.repeat(per_transaction, np.diff(np.concatenate([starts, [len(ordinal)]])))
