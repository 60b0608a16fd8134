"""Chunk planning for a replicat run: everything about a run of trail records that needs no Spark.

A chunk is a run of consecutive records of the committed trail files (rba ranges: a
file may be split over several chunks, and a chunk may span several files) that ends at
a transaction's end (`cut`). Planning finds its transactions, skips those at or below the
checkpoint's log_csn, groups the rest into target transactions (GROUPTRANSOPS) and splits
groups into units at each TRUNCATE, and works out each group's checkpoint values (end
position, log CSN, xids, audit time). A chunk holds at most `most` records (the
replicat's chunk_records): a transaction longer than that is cut into pieces (`Piece`),
each a chunk of its own planned as that one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound.errors import TrailError
from trailbound.positions import CSN_COLUMNS, Csn, Scn, TrailPosition, csn_at_or_below
from trailbound.runcounts import count_ops
from trailbound.replicat.net.rows import NetRows
from trailbound.replicat.windows import WATERMARK, high_watermarks
from trailbound.trail import format as trails


@dataclass(frozen=True)
class TrailFile:
    seqno: int
    path: str
    records: int
    sha256: str


@dataclass
class Group:
    """Source transactions applied in one target transaction."""

    txns: list[int]                      # transaction ordinals in the chunk
    units: list[tuple[int, str | None]]  # (unit, table it truncates or None), in order
    end: TrailPosition                   # position after its last record
    log_csn: Csn
    log_xid: str
    cmplt_xids: list[str]
    audit_ts: datetime
    log_bsn: Scn
    operations: int


@dataclass
class Chunk:
    files: list[TrailFile]
    light: pa.Table                      # the chunk's records, with their seqno; perhaps without after images
    txn_starts: np.ndarray               # first record of each transaction
    groups: list[Group]
    skipped: int                         # transactions at or below log_csn
    end: TrailPosition
    unit_of_record: np.ndarray           # each record's unit (meaningful for applied records)
    group_of_txn: np.ndarray             # each transaction's group (-1: skipped)
    net: NetRows | None = None
    piece: "Piece | None" = None         # part of one long transaction (see `cut`)
    op_counts: list[tuple[str, str, int]] = field(default_factory=list)  # (table, op, n) of its groups: STATS
    images: "Callable[[], pa.Array] | None" = None   # the after images of `light`, when it lacks them
    _records: pa.Table | None = None

    @property
    def records(self) -> pa.Table:
        """The chunk's records with their after images (decoded on first use when the
        trail was read without them: a chunk of inserts that carry COPY lines, applied
        as they are, never needs them)."""
        if "after" in self.light.schema.names:
            return self.light
        if self._records is None:
            at = self.light.schema.get_field_index("before") + 1
            self._records = self.light.add_column(at, "after", self.images())
        return self._records

    def transaction(self, txn: int) -> list[dict]:
        start = int(self.txn_starts[txn])
        stop = int(self.txn_starts[txn + 1]) if txn + 1 < len(self.txn_starts) else len(self.records)
        return self.records.slice(start, stop - start).to_pylist()

    def unit_records(self, unit: int, tables: set[str]) -> list[dict]:
        """The records of one unit on `tables`, in trail order (a unit is a run of
        consecutive records of one group's transactions)."""
        first, stop = (int(i) for i in np.searchsorted(self.unit_of_record, [unit, unit + 1]))
        part = self.records.slice(first, stop - first)
        mask = pc.is_in(part.column("table"), pa.array(sorted(tables), pa.string()))
        if (self.group_of_txn < 0).any():  # transactions skipped (at or below log_csn) are not the unit's
            txn_of = np.searchsorted(self.txn_starts, np.arange(first, stop), side="right") - 1
            mask = pc.and_(mask, pa.array(self.group_of_txn[txn_of] >= 0))
        return part.filter(mask).to_pylist()

    def path_of(self, seqno: int) -> str:
        return next(f.path for f in self.files if f.seqno == seqno)


class DeferredImages:
    """The after images of the trail parts a run reads without them
    (trail.format.read_parts_deferring_images), each decoded at most once, when a chunk
    first needs it. Chunks are planned in trail order: a part entirely before a chunk
    being planned is forgotten (the chunks that use it keep what they need)."""

    def __init__(self):
        self._parts: list[tuple[int, int, int, "_PartImages"]] = []   # (seqno, first rba, records, images)

    def add(self, seqno: int, part: pa.Table, decode: Callable[[], pa.ChunkedArray], now: bool = False) -> None:
        """A part's decoder; `now`: decode at once (the part's images will be needed)."""
        images = _PartImages(decode)
        if now:
            images.get()
        if len(part):
            self._parts.append((seqno, int(part.column("rba")[0].as_py()), len(part), images))

    def of(self, light: pa.Table) -> Callable[[], pa.Array]:
        """A function giving the after images of `light` (consecutive records of the parts
        added, each with its seqno and rba)."""
        n = len(light)
        if not n:
            return lambda: pa.array([], pa.string())
        seqnos, rbas = light.column("seqno").to_numpy(), light.column("rba").to_numpy()
        first = (int(seqnos[0]), int(rbas[0]))
        self._parts = [p for p in self._parts if (p[0], p[1] + p[2]) > first]
        pieces, at = [], 0
        for seqno, start, count, images in self._parts:
            if at == n:
                break
            if seqno != int(seqnos[at]) or not start <= int(rbas[at]) < start + count:
                continue
            offset = int(rbas[at]) - start
            length = min(count - offset, n - at)
            pieces.append((images, offset, length))
            at += length
        if at != n:
            raise TrailError(f"seqno {int(seqnos[at])}", "internal error: no after images for a chunk's records",
                             rba=int(rbas[at]))

        def decode() -> pa.Array:
            return pa.chunked_array([c for images, offset, length in pieces
                                     for c in images.get().slice(offset, length).chunks], pa.string())
        return decode


class _PartImages:
    def __init__(self, decode: Callable[[], pa.ChunkedArray]):
        self._decode, self._images = decode, None

    def get(self) -> pa.ChunkedArray:
        if self._images is None:
            self._images = self._decode()
        return self._images


def _transaction_starts(table: pa.Table) -> np.ndarray:
    ind = table.column("trans_ind").to_numpy()
    return np.flatnonzero((ind == trails.BEGIN) | (ind == trails.WHOLE))


@dataclass(frozen=True)
class Piece:
    """A chunk that holds part of one source transaction larger than a chunk may be
    (`cut`'s `most` records): pieces are applied one after another inside the
    transaction's one target transaction, which commits with the last."""

    number: int   # 0 for the transaction's first piece
    last: bool    # it ends the transaction


class _Pending:
    """Consecutive records read and not yet handed out as a chunk: (file, slice) pairs,
    and where transactions start among them (offsets from the first record)."""

    def __init__(self):
        self.parts: list[tuple[TrailFile, pa.Table]] = []
        self.starts = np.zeros(0, dtype=np.int64)
        self.count = 0

    def add(self, file: TrailFile, table: pa.Table) -> None:
        if len(table):
            self.parts.append((file, table))
            self.starts = np.concatenate([self.starts, _transaction_starts(table) + self.count])
            self.count += len(table)

    def first_start_from(self, offset: int) -> int | None:
        at = int(np.searchsorted(self.starts, offset))
        return int(self.starts[at]) if at < len(self.starts) else None

    def last_start_before(self, offset: int) -> int | None:
        at = int(np.searchsorted(self.starts, offset)) - 1
        return int(self.starts[at]) if at >= 0 else None

    def take(self, n: int) -> tuple[list[TrailFile], list[pa.Table]]:
        """The first `n` records, as (files, slices), removed."""
        files, tables, left = [], [], n
        while left:
            file, table = self.parts[0]
            if len(table) <= left:
                self.parts.pop(0)
            else:
                self.parts[0] = (file, table.slice(left))
                table = table.slice(0, left)
            files.append(file)
            tables.append(table)
            left -= len(table)
        self.starts = self.starts[np.searchsorted(self.starts, n):] - n
        self.count -= n
        return files, tables


def cut(files: list[TrailFile], read: Callable[[TrailFile], Iterable[pa.Table]], start_rba: int, first: int,
        most: int) -> Iterator[tuple[list[TrailFile], list[pa.Table], Piece | None]]:
    """The records of `files` from `start_rba` of the first on, as chunks: (files, their
    records' slices, None), consecutive, each ending at the first transaction end at
    which it holds at least its size (or at a file's end: transactions never cross
    files). The first chunk's size is `first` records, each next one's twice the last,
    up to `most`: applying starts once the small first chunk is prepared, and each next
    chunk is prepared while the one before is applied, and is large enough to amortise
    a chunk's fixed costs. A chunk never holds more than `most` records: a transaction
    longer than that comes as chunks of its own, its pieces (files, slices, Piece), each
    `most` records but the last. `read` gives a file's records in consecutive parts (its
    row groups), read only when the chunk that needs them is wanted; a transaction may
    span parts, so a chunk ends inside a file only where a transaction starts (or, for
    a piece, where the piece is full)."""
    size, pending, piece = min(first, most), _Pending(), None  # piece: the next piece's number
    for index, file in enumerate(files):
        skip = start_rba if index == 0 else 0
        for table in read(file):
            if skip >= len(table):
                skip -= len(table)
                continue
            pending.add(file, table.slice(skip))
            skip = 0
            while True:
                if piece is not None:  # inside a long transaction: where does it end?
                    end = pending.first_start_from(1)
                    if end is not None and end <= most:
                        yield *pending.take(end), Piece(piece, last=True)
                        piece = None
                    elif pending.count > most:  # more of it follows this piece
                        yield *pending.take(most), Piece(piece, last=False)
                        piece += 1
                    else:
                        break
                    continue
                stop = pending.first_start_from(size)  # the chunk ends before the first start once full
                if stop is not None and stop <= most:
                    yield *pending.take(stop), None
                    size = min(most, 2 * size)
                    continue
                if stop is None and pending.count <= most:
                    break  # not full yet, or the transaction at its end may still end in time
                # The chunk would hold more than `most`: it ends where the transaction
                # that makes it too long starts; that transaction, if longer than
                # `most` itself, comes in pieces.
                longest = pending.last_start_before(size) or 0
                if longest:
                    yield *pending.take(longest), None
                    size = min(most, 2 * size)
                else:
                    yield *pending.take(most), Piece(0, last=False)
                    piece = 1
        if piece is not None and pending.count:  # a transaction ends with its file
            yield *pending.take(pending.count), Piece(piece, last=True)
            piece = None
        elif pending.count >= size:
            yield *pending.take(pending.count), None
            size = min(most, 2 * size)
    if pending.count:
        yield *pending.take(pending.count), None


def group_transactions(ops: np.ndarray, skip: np.ndarray, truncates: np.ndarray, ends: np.ndarray,
                       grouptransops: int) -> np.ndarray:
    """Each transaction's group (-1: skipped), given its operations: a group takes the
    transactions not skipped, in order, until it holds `grouptransops` operations or
    more; a transaction with a TRUNCATE starts a new group, and one that `ends` (a load
    window's high watermark) is its group's last. One step per group, not per
    transaction (a 300,000-record chunk has about 60,000 of them)."""
    group_of_txn = np.full(len(ops), -1, dtype=np.int64)
    applied = np.flatnonzero(~skip)
    total = np.cumsum(ops[applied])           # operations of the applied transactions so far
    forced = truncates[applied].copy()        # where a group must start, whatever its size
    forced[1:] |= ends[applied][:-1]
    forced_at = np.flatnonzero(forced)
    start, group = 0, 0
    while start < len(applied):
        before = int(total[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(total, before + grouptransops, side="left")) + 1)
        following = int(np.searchsorted(forced_at, start, side="right"))
        if following < len(forced_at):
            stop = min(stop, int(forced_at[following]))
        group_of_txn[applied[start:stop]] = group
        start, group = stop, group + 1
    return group_of_txn


def plan_chunk(files: list[TrailFile], tables: list[pa.Table], log_csn: Csn | None, grouptransops: int,
               images: DeferredImages | None = None, piece: Piece | None = None) -> Chunk:
    """Everything about a chunk that needs no Spark: transactions, what is skipped,
    groups, units and each group's checkpoint values. `tables` are the records of
    `files`, whole or in slices (see `cut`, which also starts the first at the start rba),
    with their after images or, with `images`, without them. A `piece` of a long
    transaction is planned as that one transaction (its group's end is the piece's)."""
    parts = [table.append_column("seqno", pa.array(np.full(len(table), file.seqno, dtype=np.int64)))
             for file, table in zip(files, tables)]
    records = pa.concat_tables(parts) if parts else pa.table({})  # chunked: no copy of the images
    n = len(records)
    ind = records.column("trans_ind").to_numpy()
    starts = np.flatnonzero((ind == trails.BEGIN) | (ind == trails.WHOLE))
    if piece is not None and piece.number and n:
        starts = np.r_[0, starts].astype(np.int64)  # it goes on with the transaction of the piece before
    if n and (not len(starts) or starts[0] != 0):
        raise TrailError(files[0].path, "not the start of a transaction: replicat positions at transaction "
                                               "boundaries (alter replicat ... extrba)",
                         rba=int(records.column("rba")[0].as_py()))
    if piece is not None and len(starts) != 1:
        raise TrailError(files[0].path, "internal error: a piece of a transaction holds more than one",
                         rba=int(records.column("rba")[0].as_py()))
    stops = np.append(starts[1:], n)
    ended = ind[stops - 1] if piece is None or piece.last else np.full(len(stops), trails.END)
    unfinished = np.flatnonzero(~np.isin(ended, (trails.END, trails.WHOLE)))
    if len(unfinished):
        at = int(stops[unfinished[0]] - 1)
        seqno = int(records.column("seqno")[at].as_py())
        raise TrailError(next(f.path for f in files if f.seqno == seqno),
                                "a transaction does not end before its trail file does",
                                rba=int(records.column("rba")[at].as_py()))
    csn_columns = [records.column(c).to_numpy()[starts] for c in CSN_COLUMNS]
    skip = csn_at_or_below(csn_columns, log_csn) if log_csn is not None else np.zeros(len(starts), dtype=bool)
    truncating = np.asarray(pc.equal(records.column("op"), "TRUNCATE").to_numpy(zero_copy_only=False), dtype=bool)
    has_truncate = np.add.reduceat(truncating.astype(np.int64), starts) > 0 if n else np.zeros(0, dtype=bool)
    # A load window's high watermark ends its group: the chunk's rows go in right after it.
    # (Searching every image for a high mark costs a tenth of a second per 300,000 records:
    # only when the chunk holds watermark records at all.)
    if n and pc.any(pc.equal(records.column("table"), WATERMARK.name)).as_py():
        if "after" not in records.schema.names:  # the marks are in the images
            records = records.add_column(records.schema.get_field_index("before") + 1, "after", images.of(records)())
        marks = high_watermarks(records)
    else:
        marks = np.zeros(n, dtype=bool)
    ends_group = np.add.reduceat(marks.astype(np.int64), starts) > 0 if n else np.zeros(0, dtype=bool)
    group_of_txn = group_transactions(stops - starts, skip, has_truncate, ends_group, grouptransops)

    # Units: a new one at each group's first record, at each TRUNCATE and just after it.
    boundary = np.zeros(n + 1, dtype=bool)
    applied_txns = np.flatnonzero(group_of_txn >= 0)
    if len(applied_txns):
        firsts = applied_txns[np.r_[True, group_of_txn[applied_txns][1:] != group_of_txn[applied_txns][:-1]]]
        boundary[starts[firsts]] = True
    truncate_at = np.flatnonzero(truncating)
    boundary[truncate_at] = True
    boundary[truncate_at + 1] = True
    unit_of_record = np.cumsum(boundary[:n]) - 1

    seqnos = records.column("seqno").to_numpy()
    rbas = records.column("rba").to_numpy()
    xids = records.column("xid")
    tables = records.column("table")
    commit_ts = records.column("commit_ts")
    bsns = records.column("log_bsn").to_numpy()
    truncated_table = {int(unit_of_record[r]): tables[int(r)].as_py() for r in truncate_at}
    groups: list[Group] = []
    if len(applied_txns):
        txn_groups = group_of_txn[applied_txns]
        cuts = np.flatnonzero(np.r_[True, txn_groups[1:] != txn_groups[:-1], True])
        firsts, lasts = applied_txns[cuts[:-1]], applied_txns[cuts[1:] - 1]
        last_records = stops[lasts] - 1
        # Each group's values at once, as Python values (an Arrow scalar per group costs
        # microseconds each, and a chunk has hundreds of groups).
        last_xids = xids.take(pa.array(starts[lasts])).to_pylist()
        last_ts = commit_ts.take(pa.array(starts[lasts])).to_pylist()
        last_csns = [Csn(*values) for values in zip(*(column[lasts].tolist() for column in csn_columns))]
        ends = zip(seqnos[last_records].tolist(), (rbas[last_records] + 1).tolist())
        first_units, last_units = unit_of_record[starts[firsts]].tolist(), unit_of_record[last_records].tolist()
        # The transactions that commit at the group's last SCN: its log_cmplt_xids.
        scns = csn_columns[0]
        at_last_scn = applied_txns[scns[applied_txns] == np.repeat(scns[lasts], np.diff(cuts))]
        cmplt = xids.take(pa.array(starts[at_last_scn])).to_pylist()
        cmplt_cuts = np.append(np.searchsorted(at_last_scn, firsts), len(at_last_scn)).tolist()
        operations = np.add.reduceat((stops - starts)[applied_txns], cuts[:-1]).tolist()
        bsn_values = [Scn(value) for value in bsns[last_records].tolist()]
        for g, (end_seqno, end_rba) in enumerate(ends):
            # Units never cross groups, and their numbers increase along the trail.
            units = [(unit, truncated_table.get(unit)) for unit in range(first_units[g], last_units[g] + 1)]
            groups.append(Group(
                txns=applied_txns[cuts[g]:cuts[g + 1]].tolist(), units=units, end=TrailPosition(end_seqno, end_rba),
                log_csn=last_csns[g], log_xid=last_xids[g], cmplt_xids=cmplt[cmplt_cuts[g]:cmplt_cuts[g + 1]],
                audit_ts=last_ts[g], log_bsn=bsn_values[g], operations=operations[g]))
    op_counts = []
    if groups:
        # The operations per table of the records the groups apply (not the skipped), for
        # STATS REPLICAT: one Arrow group-by per chunk (runcounts.count_ops).
        applied = np.repeat(group_of_txn >= 0, stops - starts)
        keyed = pa.table({"table": tables, "op": records.column("op")})
        op_counts = count_ops(keyed if applied.all() else keyed.filter(pa.array(applied)))
    end = TrailPosition(int(seqnos[-1]), int(rbas[-1]) + 1) if n else TrailPosition(files[-1].seqno, files[-1].records)
    # A transaction in pieces counts as skipped once, at its last.
    skipped = int(skip.sum()) if piece is None or piece.last else 0
    return Chunk(files, records, starts, groups, skipped, end, unit_of_record, group_of_txn, op_counts=op_counts,
                 images=images.of(records) if images is not None and "after" not in records.schema.names else None,
                 piece=piece)
