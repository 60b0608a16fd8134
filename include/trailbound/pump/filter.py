"""The pump's TABLE filter: the records of the selected tables, as a trail file of their own."""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound import heartbeat
from trailbound.trail import format as trails


def filter_records(table: pa.Table, patterns: list[str]) -> pa.Table:
    """The records of the selected tables (and heartbeats, always), as a trail file of
    their own: RBAs from 0 and transaction indicators rewritten at the new boundaries. A
    transaction that keeps no record disappears; one that keeps one record becomes WHOLE."""
    kept = list(filter_parts([table], patterns))
    return pa.concat_tables(kept) if kept else table.slice(0, 0)


def filter_parts(parts: Iterable[pa.Table], patterns: list[str]) -> Iterator[pa.Table]:
    """filter_records over a file that comes a part (a row group) at a time, so that the
    pump holds a part, never the file (one transaction can be a file of 10 million
    records). A kept part is held back until the next kept record is seen: whether its
    last record ends its transaction depends on it."""
    regex = heartbeat.selection(patterns)
    begun = 0  # the transactions begun in the parts before this one
    rba = 0
    previous: int | None = None  # the transaction of the last record yielded
    held: tuple[pa.Table, np.ndarray] | None = None
    for part in parts:
        names = [n for n in pc.unique(part.column("table")).to_pylist() if n is not None and regex.fullmatch(n)]
        keep = pc.fill_null(pc.is_in(part.column("table"), pa.array(names, pa.string())), False)
        keep = np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool)
        # Each record's transaction, numbered across the parts: a transaction starts at
        # its BEGIN or WHOLE record.
        starts = np.isin(part.column("trans_ind").to_numpy(), (trails.BEGIN, trails.WHOLE))
        transactions = (begun + np.cumsum(starts))[keep]
        begun += int(starts.sum())
        if not len(transactions):
            continue
        if held is not None:
            yield _renumbered(*held, previous, int(transactions[0]), rba)
            rba, previous = rba + len(held[0]), int(held[1][-1])
        held = (part.filter(pa.array(keep)), transactions)
    if held is not None:
        yield _renumbered(*held, previous, None, rba)


def _renumbered(kept: pa.Table, transactions: np.ndarray, previous: int | None, following: int | None,
                first_rba: int) -> pa.Table:
    """Kept records with their transaction indicators at the new boundaries (given the
    transactions of the kept records just before and after them) and rbas from `first_rba`."""
    indicators = trails.transaction_indicators([transactions], None if previous is None else (previous,),
                                               None if following is None else (following,))
    kept = kept.set_column(kept.schema.get_field_index("trans_ind"), "trans_ind", pa.array(indicators, pa.int8()))
    rbas = pa.array(np.arange(first_rba, first_rba + len(kept), dtype=np.int64))
    return kept.set_column(kept.schema.get_field_index("rba"), "rba", rbas)
