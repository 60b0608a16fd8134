"""A capture run's trail written by one task: no shuffle, no grouping by Spark.

The general assembly (capture.assemble) groups a log's records by transaction with a
shuffle, rolls them up, joins them back and sorts them into files: JIT, the planning of
several actions, shuffles and a cached roll-up (about 60 Spark CPU-seconds per million
changes; docs/benchmarks/capture-cli.md). A run's window is small enough to be decided in
one process from its narrow columns, so a run is written by one Spark task that reads the
window twice:

1. The narrow columns (ids, operations, positions) of every thread's segments, part by
   part: each record's transaction (thread, top-level xid: a subtransaction's records
   belong to its parent_xid, as in capture.assemble), each transaction's start, end (its
   first top-level COMMIT or ROLLBACK), fate (decided exactly as capture.assemble decides
   it) and CSN, each subtransaction's first ROLLBACK (its records then never reach the
   trail), the transactions open at the horizon and what was read per thread. Kept per
   record: its transaction's number and whether it is captured (5 bytes), per transaction
   a few numbers. The trail's order follows: the written transactions by CSN, each one's
   records in log order.
2. Every column, the records emitted in that order into the trail files as they come
   (trail.format.write_planned_files, the same files, rollover and checks as
   capture.trailwrite). When the order is the log's (one thread, transactions whole and in
   commit order: a replication slot's archive) the segments are streamed a part at a time,
   as read. Otherwise (threads and transactions interleaved: a RAC-like or simulated
   archive) the order is a permutation of the window's records, emitted a chunk at a time
   from a cache of decoded segments: a segment is dropped once its last record to write is
   out, cut down to the records it still has to give once few are left, and beyond a byte
   budget (`CACHE_BYTES`) the least recently used ones are dropped and read again when
   needed (slower, still right: a long transaction pins only its own records).

The driver verifies the files (capture.trailwrite.verify). Nothing is assumed: this path
is taken only when no transaction is skipped, forced or persisted (an open one is simply
read again from its start, as every run does) and the window's segments are Parquet
(`reason_not_to`), and then only if the first pass finds nothing the grouping would call a
contract violation (a record after its transaction's end or its savepoint's rollback, an
xid that is both a subtransaction and a transaction, a subtransaction under two parents).
Otherwise it writes nothing, says why, and the run goes through capture.assemble, which
writes the same trail (tests/test_capture_onetask.py compares them byte for byte) and names
any record that breaks the contract.
"""

from __future__ import annotations

import json
from collections import OrderedDict
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
# Decoded segments the reordering second pass may hold beyond those the current chunk
# needs. The simulated 2M archive decodes to about 340 MB in all (about 170 B a record);
# in commit order only the segments of transactions still open at the current CSN are
# needed, a few MB, so the budget is there for long transactions: beyond it the least
# recently used segments are dropped and read again (each re-read costs a segment's read,
# about 2 ms for 2,000 records).
CACHE_BYTES = 256 * 1024 * 1024
# Records emitted per chunk of the reordering pass (a chunk's records are gathered from
# the cache, then written); at most a 1/16th of the budget's worth at ~170 B a record, so
# that a tiny budget (a test's) gives small chunks.
_CHUNK_RECORDS = 65_536
_RECORD_BYTES = 170

ONE_PASS = "in commit order (one pass)"
REORDERED = "in commit order (one task)"


def reason_not_to(segments, restored_files, window: logread.ReadWindow, open_transactions, directives) -> str | None:
    """Why a run cannot be written by one task whatever its records are, or None."""
    if any(t.skip_reason or t.persisted for t in open_transactions):
        return "transactions skipped or persisted by an earlier run"
    if restored_files or window.held:
        return "persisted transactions to restore"
    if directives:
        return "skiptrans or forcetrans pending"
    if any(s.format != "parquet" for s in segments):
        return "JSON Lines segments"
    return None


@dataclass(frozen=True)
class Task:
    """What the one task needs: the log to read and the trail to write."""

    inputs: list                    # logread._Input of the window's segments, by thread and sequence
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
    cache_bytes: int = CACHE_BYTES  # the reordering pass's budget of decoded segments


@dataclass
class Written:
    """What the task did: `reason` (why it wrote nothing and the general path must run),
    else the files (dicts as capture.trailwrite's rows, with their transaction counts and
    op counts), what was read (capture.assemble's log_reads rows, one per thread), the
    transactions left open at the horizon (open-transactions rows as the general path's)
    and how the records were ordered (`ONE_PASS` or `REORDERED`, with the segments read
    again)."""

    reason: str | None
    files: list[dict]
    reads: list[dict]
    open: list[dict]
    how: str = ONE_PASS


def write(task: Task) -> Written:
    """Runs in a Spark task (trailbound.spark.run_tasks)."""
    try:
        shape = _first_pass(task)
    except Exception as exc:  # an unreadable file: the general path reads it again and names it
        return Written(f"first pass failed: {' '.join(str(exc).split())}", [], [], [])
    if isinstance(shape, str):
        return Written(shape, [], [], [])
    if shape is None:
        return Written(None, [], [], [])
    pa.default_memory_pool().release_unused()  # what the narrow parts took (about 100 MB at 2M records)
    files, how = _second_pass(task, shape)
    pa.default_memory_pool().release_unused()  # the worker stays for the run's next tasks
    return Written(None, files, shape.reads, shape.open_rows(), how)


def check_or_write(item: tuple[str, object]):
    """A task of a run's one job: ("check", segments) checks a run of new segments
    (archive.segments.check_run), ("write", Task) writes the trail (`write`)."""
    from trailbound.archive import segments

    kind, what = item
    return segments.check_run(what) if kind == "check" else write(what)


class _Ids:
    """Numbers for (thread, xid) keys, given in the order the keys are first met.

    Only the live keys are looked up (a dict of a few thousand, not one entry per
    transaction of the window: 150 B each, 75 MB for 500,000): a key that `retire`d (its
    transaction ended) and comes again gets a new number, and `reused` finds it at the
    end among every key given (kept as Arrow strings, about 15 B each)."""

    def __init__(self):
        self.live: dict[tuple[int, str], int] = {}
        self.count = 0
        self._threads: list[np.ndarray] = []
        self._names: list[pa.Array] = []
        self._table: pa.Table | None = None  # made once the pass is over

    def of(self, thread: np.ndarray, names: pa.Array) -> np.ndarray:
        encoded = pc.dictionary_encode(names)
        words = encoded.dictionary.to_pylist()
        span = int(thread.max()) + 1
        # One key per (thread, word) of the part, looked up once (a part has a few
        # thousand transactions for 100,000 records).
        keys, inverse = np.unique(encoded.indices.to_numpy().astype(np.int64) * span + thread, return_inverse=True)
        found = np.empty(len(keys), dtype=np.int32)
        new_threads, new_names = [], []
        for k, key in enumerate(keys.tolist()):
            pair = (key % span, words[key // span])
            number = self.live.get(pair)
            if number is None:
                number = self.live[pair] = self.count
                self.count += 1
                new_threads.append(pair[0])
                new_names.append(pair[1])
            found[k] = number
        if new_names:
            self._threads.append(np.array(new_threads, dtype=np.int32))
            self._names.append(pa.array(new_names, pa.string()))
        return found[inverse.reshape(-1)]

    def retire(self, threads: np.ndarray, names: pa.Array) -> None:
        """These keys are looked up no more: a record of theirs gets a new number."""
        for pair in zip(threads.tolist(), names.to_pylist()):
            self.live.pop(pair, None)

    def reused(self, other: "_Ids | None" = None) -> tuple[int, str] | None:
        """A key given two numbers (or, with `other`, a key of both), if any."""
        table = self.table()
        if other is None:
            counts = table.group_by(["thread", "xid"], use_threads=False).aggregate([([], "count_all")])
            twice = counts.filter(pc.greater(counts["count_all"], 1))
        else:
            twice = table.join(other.table(), ["thread", "xid"], join_type="inner", use_threads=False)
        return (twice["thread"][0].as_py(), twice["xid"][0].as_py()) if len(twice) else None

    def table(self) -> pa.Table:
        """Every key given, by number: (thread, xid). Called once every key is given."""
        if self._table is None:
            threads = np.concatenate(self._threads) if self._threads else np.zeros(0, dtype=np.int32)
            names = pa.concat_arrays(self._names) if self._names else pa.array([], pa.string())
            self._table = pa.table({"thread": threads, "xid": names})
            self._threads, self._names = [], []
        return self._table

    def key(self, number: int) -> tuple[int, str]:
        table = self.table()
        return int(table["thread"][number].as_py()), table["xid"][number].as_py()


class _PerId:
    """Columns indexed by a key's number, grown as keys come (by half: doubling left up to
    half of them unused, 35 MB of 70 at 2M simulated records)."""

    def __init__(self, **columns: tuple[type, object]):
        self._fill = columns
        self._size = 0
        for name, (dtype, fill) in columns.items():
            setattr(self, name, np.full(0, fill, dtype=dtype))

    def grow(self, n: int) -> None:
        if n <= self._size:
            return
        size = max(n, self._size + self._size // 2, 1024)
        for name, (dtype, fill) in self._fill.items():
            old = getattr(self, name)
            new = np.full(size, fill, dtype=dtype)
            new[:len(old)] = old
            setattr(self, name, new)
        self._size = size

    def trimmed(self, n: int) -> None:
        for name in self._fill:
            setattr(self, name, getattr(self, name)[:n])


def _transactions() -> _PerId:
    """Per transaction: its thread, first record's position, last record's index (in
    the window's read order), end (first top-level COMMIT/ROLLBACK: index, position,
    time, committed), records, captured records. About 70 B each (a sequence has at most
    9 digits, an rba 32 bits)."""
    return _PerId(thread=(np.int32, 0), start_sequence=(np.int32, 0), start_rba=(np.uint32, 0),
                  start_scn=(np.int64, 0), start_ts=(np.int64, 0), last=(np.int64, -1), end=(np.int64, -1),
                  end_sequence=(np.int32, 0), end_rba=(np.uint32, 0), end_scn=(np.int64, 0), end_ts=(np.int64, 0),
                  committed=(np.bool_, False), records=(np.int32, 0), captured=(np.int32, 0))


def _subtransactions() -> _PerId:
    """Per subtransaction: its transaction, last record's index, first ROLLBACK's index,
    captured records."""
    return _PerId(txn=(np.int32, -1), last=(np.int64, -1), rollback=(np.int64, -1), captured=(np.int32, 0))


@dataclass
class _Shape:
    """The first pass's findings. Per record of the window (in read order: thread,
    sequence, rba): its transaction's number (`txn`) and whether it goes to the trail
    (`out`, or `order`: the indices of those records in trail order, None when that is
    the read order). Per segment read, its records in the window (`offsets`). Per
    transaction: its rank in commit order among those written (`rank`, -1: not written)
    and whether it is open at the horizon; per rank, the CSN columns and commit time."""

    offsets: np.ndarray
    txn: np.ndarray
    out: np.ndarray
    order: np.ndarray | None
    rank: np.ndarray
    csn: np.ndarray
    csn_thread: np.ndarray
    csn_sequence: np.ndarray
    csn_rba: np.ndarray
    commit_ts: np.ndarray
    is_open: np.ndarray
    open_bytes: np.ndarray   # per transaction (the open ones'): its images' bytes, counted by the second pass
    reads: list[dict]
    open_template: list[tuple[int, dict]]  # (transaction number, open row without its bytes)

    def open_rows(self) -> list[dict]:
        return [dict(row, bytes=int(self.open_bytes[number])) for number, row in self.open_template]


def _narrow_parts(task: Task):
    """The window's records, narrow columns only (with thread, sequence, txid and the
    input's index), about logread._RECORDS_PER_PART at a time: small segments are read a
    few together, since each compute call costs about as much on 2,000 records as on
    100,000."""
    import pyarrow.parquet as pq

    pending, count = [], 0

    def prepared():
        table = pa.concat_tables(pending)
        table = table.append_column("txid", pc.coalesce(table["parent_xid"], table["xid"]))
        table = table.append_column("restored", pa.repeat(False, len(table)))
        return table.filter(task.window.keep(table))

    for number, item in enumerate(task.inputs):
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
            table = table.append_column("input", pa.repeat(pa.scalar(number, pa.int32()), n))
            pending.append(table)
            count += n
            if count >= logread._RECORDS_PER_PART:
                yield prepared()
                pending, count = [], 0
    if pending:
        yield prepared()


def _numpy(column) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.to_numpy(zero_copy_only=False)


def _first_and_last(numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct numbers of an array and the index of each one's first and last row."""
    keys, first = np.unique(numbers, return_index=True)
    _, from_end = np.unique(numbers[::-1], return_index=True)
    return keys, first, len(numbers) - 1 - from_end


def _first_pass(task: Task) -> _Shape | str | None:
    """The window's transactions, their fates and the trail's order; or why the grouping
    must write the run (a str); or None when the window holds no record."""
    captured_of = logread._captured_matcher(task.tables)
    txn_ids, sub_ids = _Ids(), _Ids()
    T, S = _transactions(), _subtransactions()
    txns, captured_parts, sub_rows, sub_numbers = [], [], [], []
    per_input = np.zeros(len(task.inputs), dtype=np.int64)
    reads: dict[int, dict] = {}
    n = 0
    for part in _narrow_parts(task):
        m = len(part)
        if not m:
            continue
        index = np.arange(n, n + m)
        per_input += np.bincount(_numpy(part["input"]), minlength=len(task.inputs))
        if part["xid"].null_count:
            return "a record without an xid"
        thread = _numpy(part["thread"]).astype(np.int64)
        txid = part["txid"].combine_chunks()
        known = txn_ids.count
        txn = txn_ids.of(thread, txid)
        T.grow(txn_ids.count)
        sequence, rba, scn = (_numpy(part[c]) for c in ("sequence", "rba", "scn"))
        ts = _numpy(part["ts"].cast(pa.int64()))
        op = part["op"]
        is_sub = _numpy(pc.is_valid(part["parent_xid"]))
        captured = _numpy(captured_of(part))
        # Transactions: first and last records, ends, counts.
        keys, first, last = _first_and_last(txn)
        new = keys >= known  # numbered as first met: a new one's first record is here
        numbers, rows = keys[new], first[new]
        T.thread[numbers] = thread[rows]
        T.start_sequence[numbers], T.start_rba[numbers] = sequence[rows], rba[rows]
        T.start_scn[numbers], T.start_ts[numbers] = scn[rows], ts[rows]
        T.last[keys] = index[last]
        T.records[:txn_ids.count] += np.bincount(txn, minlength=txn_ids.count).astype(np.int32)
        T.captured[:txn_ids.count] += np.bincount(txn[captured], minlength=txn_ids.count).astype(np.int32)
        ends = np.flatnonzero(_numpy(pc.is_in(op, value_set=_END_OPS)) & ~is_sub)
        if len(ends):
            keys, first = np.unique(txn[ends], return_index=True)
            fresh = T.end[keys] < 0  # a later end is a record after the end: found below
            numbers, rows = keys[fresh], ends[first[fresh]]
            T.end[numbers] = index[rows]
            T.end_sequence[numbers], T.end_rba[numbers] = sequence[rows], rba[rows]
            T.end_scn[numbers], T.end_ts[numbers] = scn[rows], ts[rows]
            T.committed[numbers] = _numpy(pc.equal(op.take(pa.array(rows)), "COMMIT"))
        # Subtransactions (a parent_xid): their transaction, last record, first ROLLBACK.
        subs = np.flatnonzero(is_sub)
        if len(subs):
            xid, parent = part["xid"].take(pa.array(subs)), part["parent_xid"].take(pa.array(subs))
            if pc.any(pc.equal(xid, parent)).as_py():
                return "a record whose parent_xid is its own xid"
            sub = sub_ids.of(thread[subs], xid.combine_chunks())
            S.grow(sub_ids.count)
            keys, first, last = _first_and_last(sub)
            S.txn[keys] = np.where(S.txn[keys] >= 0, S.txn[keys], txn[subs[first]])
            if np.any(txn[subs] != S.txn[sub]):
                return "a subtransaction under more than one transaction"
            S.last[keys] = index[subs[last]]
            S.captured[:sub_ids.count] += np.bincount(sub[captured[subs]], minlength=sub_ids.count).astype(np.int32)
            rollbacks = np.flatnonzero(_numpy(pc.equal(op.take(pa.array(subs)), "ROLLBACK")))
            if len(rollbacks):
                keys, first = np.unique(sub[rollbacks], return_index=True)
                fresh = S.rollback[keys] < 0
                S.rollback[keys[fresh]] = index[subs[rollbacks[first[fresh]]]]
            sub_rows.append(index[subs])
            sub_numbers.append(sub)
        if len(ends):  # the ended transactions' keys and their subtransactions' are looked up no more
            txn_ids.retire(thread[rows], txid.take(pa.array(rows)))
            for pair, number in list(sub_ids.live.items()):
                if T.end[S.txn[number]] >= 0:
                    del sub_ids.live[pair]
        # What was read per thread (capture.assemble's log_reads).
        for number in np.unique(thread).tolist():
            rows = np.flatnonzero(thread == number)
            read = reads.setdefault(number, {"thread": number, "n": 0, "reread": 0, "from_time": None,
                                             "first": _position(sequence, rba, scn, ts, rows[0]), "last": None})
            read["n"] += len(rows)
            read["last"] = _position(sequence, rba, scn, ts, rows[-1])
            if task.read_scn is not None:
                read["reread"] += int(np.count_nonzero(scn[rows] < task.read_scn))
            earliest = int(ts[rows].min())
            read["from_time"] = earliest if read["from_time"] is None else min(read["from_time"], earliest)
        txns.append(txn)
        captured_parts.append(captured)
        n += m
    if not n:
        return None
    transactions = txn_ids.count
    T.trimmed(transactions)
    S.trimmed(sub_ids.count)

    # What the grouping reports as a contract violation: the grouping writes the run and names the record.
    ended = T.end >= 0
    after = np.flatnonzero(ended & (T.last > T.end))
    if len(after):
        thread, xid = txn_ids.key(int(after[0]))
        return f"a record of transaction {xid} (thread {thread}) after its end"
    rolled_back = S.rollback >= 0
    after = np.flatnonzero(rolled_back & (S.last > S.rollback))
    if len(after):
        thread, xid = sub_ids.key(int(after[0]))
        return f"a record of subtransaction {xid} (thread {thread}) after its ROLLBACK"
    for what, again in (("a transaction's xid used again after its end", txn_ids.reused()),
                        ("a subtransaction's xid used again after its transaction's end", sub_ids.reused()),
                        ("an xid both a subtransaction's and a transaction's", sub_ids.reused(txn_ids))):
        if again is not None:
            return f"{what}: {again[1]} (thread {again[0]})"

    # Fates, as capture.assemble decides them.
    kept = T.captured.astype(np.int64) - np.bincount(S.txn[rolled_back], weights=S.captured[rolled_back],
                                                     minlength=transactions).astype(np.int64)
    written = ended & T.committed & (T.start_scn >= task.begin_scn) & (kept > 0)
    if task.read_scn is not None:
        written &= T.end_scn >= task.read_scn
    if task.last_written is not None:
        written &= ~csn_at_or_below([T.end_scn, T.thread, T.end_sequence, T.end_rba], task.last_written)
    by_csn = np.flatnonzero(written)
    by_csn = by_csn[np.lexsort((T.end_rba[by_csn], T.end_sequence[by_csn], T.thread[by_csn], T.end_scn[by_csn]))]
    rank = np.full(transactions, -1, dtype=np.int32 if transactions < 2**31 else np.int64)
    rank[by_csn] = np.arange(len(by_csn))

    # The records to write: captured ones of written transactions, not of a rolled-back subtransaction.
    txn = np.concatenate(txns)
    del txns
    out = np.concatenate(captured_parts)
    del captured_parts
    out &= written[txn]
    if sub_rows:
        rows, subs = np.concatenate(sub_rows), np.concatenate(sub_numbers)
        out[rows[rolled_back[subs]]] = False
    indices = np.flatnonzero(out)
    if n < 2**31:  # 4 bytes a record to write, not 8
        indices = indices.astype(np.int32)
    ranks = rank[txn[indices]]
    order = None
    if np.any(np.diff(ranks) < 0):  # not the log's order: a permutation (stable: each transaction in log order)
        order = indices[np.argsort(ranks, kind="stable")]
    del indices, ranks

    is_open = ~ended
    open_template = []
    for number in np.flatnonzero(is_open).tolist():
        thread, xid = txn_ids.key(number)
        start = {"sequence": int(T.start_sequence[number]), "rba": int(T.start_rba[number]),
                 "scn": int(T.start_scn[number]), "ts": _time(T.start_ts[number])}
        open_template.append((number, {
            "thread": thread, "txid": xid, "start": start, "end": None, "records": int(T.records[number]),
            "skip_reason": "in flight at the begin point" if start["scn"] < task.begin_scn else None,
            "forced": False}))
    open_template.sort(key=lambda item: (item[1]["start"]["ts"], item[1]["thread"], item[1]["txid"]))
    for read in reads.values():
        read["from_time"] = _time(read["from_time"])
    return _Shape(np.concatenate([[0], np.cumsum(per_input)]), txn, out, order, rank, T.end_scn[by_csn],
                  T.thread[by_csn], T.end_sequence[by_csn].astype(np.int64), T.end_rba[by_csn].astype(np.int64),
                  T.end_ts[by_csn], is_open, np.zeros(transactions, dtype=np.int64), [reads[t] for t in sorted(reads)],
                  open_template)


def _time(micros):
    return pa.scalar(int(micros), pa.timestamp("us", "UTC")).as_py()


def _position(sequence, rba, scn, ts, row) -> dict:
    return {"sequence": int(sequence[row]), "rba": int(rba[row]), "scn": int(scn[row]), "ts": _time(ts[row])}


def _octets(column) -> np.ndarray:
    return logread._octets(column).to_numpy()


def _second_pass(task: Task, shape: _Shape) -> tuple[list[dict], str]:
    """Every column of the window's records again; the captured records of the written
    transactions, with their CSNs and file numbers, into trail files in commit order."""
    files: list[dict] = []
    per_file: dict[int, dict] = {}
    rollover = {"file": 0, "bytes": 0, "transaction": -1}
    source = _Streamed(task, shape) if shape.order is None else _Gathered(task, shape)

    def batches():
        for part, txn in source.parts():
            ordinal = shape.rank[txn]
            # A record's size as capture.logread's summaries count it (the trail's Arrow bytes).
            row_bytes = trails.FIXED_ROW_BYTES + sum(_octets(part[c]) for c in ("txid", "op", "table", "before",
                                                                                "after"))
            numbers = _file_numbers(ordinal, row_bytes, rollover, task.max_bytes, per_file)
            k = len(part)
            batch = pa.table({
                "csn": shape.csn[ordinal], "csn_thread": shape.csn_thread[ordinal],
                "csn_sequence": shape.csn_sequence[ordinal], "csn_rba": shape.csn_rba[ordinal],
                "xid": part["txid"],
                "commit_ts": pa.array(shape.commit_ts[ordinal], pa.int64()).cast(pa.timestamp("us", "UTC")),
                "op": part["op"], "table": part["table"], "before": part["before"], "after": part["after"],
                "src_thread": part["thread"], "src_sequence": part["sequence"], "src_rba": part["rba"],
                "src_scn": part["scn"], "log_bsn": pa.repeat(pa.scalar(task.log_bsn, pa.int64()), k),
                "file_no": pa.array(numbers, pa.int64())})
            for number, table, op, count in count_ops(batch, keys=("file_no",)):
                per_file[number]["op_counts"].append([table, op, count])
            yield from batch.to_batches()
        source.count_the_rest()

    for info in trails.write_planned_files(Path(task.prefix), task.first_seqno, batches(), group=task.group,
                                           log_bsn=Scn(task.log_bsn), layouts=task.layouts, versions=task.versions,
                                           claim=task.claim):
        number = info.seqno - task.first_seqno
        files.append({
            "file_no": number, "path": str(info.path), "records": info.records, "bytes": info.bytes,
            "sha256": info.sha256, "first_csn": str(info.first_csn), "last_csn": str(info.last_csn),
            "transactions": per_file[number]["transactions"],
            "op_counts": json.dumps(per_file[number]["op_counts"])})
    return files, source.how()


def _count_open_bytes(shape: _Shape, part: pa.Table, txn: np.ndarray) -> None:
    """Adds the images' bytes of the open transactions' records of `part` (the size the
    general path gives an open transaction)."""
    its = shape.is_open[txn]
    if its.any():
        sizes = (_octets(part["before"]) + _octets(part["after"]))[its]
        shape.open_bytes += np.bincount(txn[its], weights=sizes, minlength=len(shape.open_bytes)).astype(np.int64)


class _Streamed:
    """The records to write when their order is the log's: every segment read once, a
    part at a time (a task holds one part, whatever the size of a segment)."""

    def __init__(self, task: Task, shape: _Shape):
        self.task, self.shape, self.offset = task, shape, 0

    def parts(self):
        shape = self.shape
        for part in logread._read_parts(self.task.inputs, self.task.window):
            m = len(part)
            if not m:
                continue
            txn = shape.txn[self.offset:self.offset + m]
            keep = shape.out[self.offset:self.offset + m]
            self.offset += m
            if self.offset > len(shape.txn):
                raise RuntimeError("the second pass read other records than the first")  # files are immutable
            _count_open_bytes(shape, part, txn)
            if keep.any():
                yield part.filter(pa.array(keep)), txn[keep]

    def count_the_rest(self) -> None:
        if self.offset != len(self.shape.txn):
            raise RuntimeError("the second pass read fewer records than the first")

    def how(self) -> str:
        return ONE_PASS


class _Gathered:
    """The records to write when their order is not the log's: gathered chunk by chunk
    from a cache of decoded segments (see the module's docstring)."""

    def __init__(self, task: Task, shape: _Shape):
        self.task, self.shape = task, shape
        self.order = shape.order
        # Per record to write (in trail order): its segment, and per segment its records
        # to write in trail order (`pending`, a slice of `by_segment` from `done`).
        self.segment_of = (np.searchsorted(shape.offsets, self.order, side="right") - 1).astype(np.int32)
        self.by_segment = np.argsort(self.segment_of, kind="stable").astype(self.order.dtype)
        counts = np.bincount(self.segment_of, minlength=len(task.inputs))
        self.bounds = np.concatenate([[0], np.cumsum(counts)])
        self.done = np.zeros(len(task.inputs), dtype=np.int64)
        self.cache: OrderedDict[int, tuple[np.ndarray | None, pa.Table]] = OrderedDict()  # LRU first
        self.cached_bytes = 0
        self.decoded = np.zeros(len(task.inputs), dtype=bool)
        self.reads = 0
        self.chunk = max(1, min(_CHUNK_RECORDS, task.cache_bytes // 16 // _RECORD_BYTES))

    def segment(self, number: int) -> pa.Table:
        """A segment's records in the window, every column, decoded again (counted)."""
        item = self.task.inputs[number]
        table = logread._prepared(list(logread._file_parts(item)), self.task.window)
        start, stop = self.shape.offsets[number], self.shape.offsets[number + 1]
        if len(table) != stop - start:
            raise RuntimeError("the second pass read other records than the first")  # files are immutable
        self.reads += 1
        if not self.decoded[number]:
            self.decoded[number] = True
            _count_open_bytes(self.shape, table, self.shape.txn[start:stop])
        return table

    def parts(self):
        order, shape = self.order, self.shape
        for at in range(0, len(order), self.chunk):
            records = order[at:at + self.chunk]
            segments = self.segment_of[at:at + self.chunk]
            by_segment = np.argsort(segments, kind="stable")
            wanted, starts = np.unique(segments[by_segment], return_index=True)
            spans = list(zip(wanted.tolist(), starts.tolist(), [*starts[1:].tolist(), len(records)]))
            pieces = [self._take(number, records[by_segment[first:last]] - shape.offsets[number])
                      for number, first, last in spans]
            self._keep_within_budget(set(wanted.tolist()))
            gathered = pa.concat_tables(pieces)
            # Back from segment order to trail order.
            back = np.empty(len(records), dtype=np.int64)
            back[by_segment] = np.arange(len(records))
            yield gathered.take(pa.array(back)), shape.txn[records]
            for number, first, last in spans:
                self.done[number] += last - first
                self._shrink(number)

    def _take(self, number: int, rows: np.ndarray) -> pa.Table:
        entry = self.cache.pop(number, None)
        if entry is None:
            entry = (None, self.segment(number))
            self.cached_bytes += entry[1].nbytes
        self.cache[number] = entry  # most recently used
        kept, table = entry
        return table.take(pa.array(rows if kept is None else np.searchsorted(kept, rows)))

    def _shrink(self, number: int) -> None:
        """Drops a segment whose records are all out; cuts one down to the records it still
        has to give once they are under a quarter of what it holds."""
        entry = self.cache.get(number)
        if entry is None:
            return
        left = self.bounds[number + 1] - self.bounds[number] - self.done[number]
        kept, table = entry
        if left == 0:
            del self.cache[number]
            self.cached_bytes -= table.nbytes
        elif 4 * left < len(table):
            pending = self.order[self.by_segment[self.bounds[number] + self.done[number]:self.bounds[number + 1]]]
            rows = np.sort(pending - self.shape.offsets[number])
            smaller = table.take(pa.array(rows if kept is None else np.searchsorted(kept, rows)))
            self.cached_bytes += smaller.nbytes - table.nbytes
            self.cache[number] = (rows, smaller)  # its place in the LRU order unchanged

    def _keep_within_budget(self, in_use: set[int]) -> None:
        for number in list(self.cache):
            if self.cached_bytes <= self.task.cache_bytes:
                return
            if number not in in_use:
                self.cached_bytes -= self.cache.pop(number)[1].nbytes

    def count_the_rest(self) -> None:
        """The open transactions' bytes in segments that had nothing to write."""
        shape = self.shape
        running = np.concatenate([[0], np.cumsum(shape.is_open[shape.txn])])
        open_records = running[shape.offsets[1:]] - running[shape.offsets[:-1]]
        for number in np.flatnonzero((open_records > 0) & ~self.decoded).tolist():
            self.segment(number)

    def how(self) -> str:
        again = self.reads - int(self.decoded.sum())
        return REORDERED + (f", {again} segment reads again beyond the cache" if again else "")


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
