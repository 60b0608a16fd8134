"""The pump's TABLE filter: the records of the selected tables, as a trail file of their own."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound import heartbeat
from trailbound.trail import format as trails


def filter_records(table: pa.Table, patterns: list[str]) -> pa.Table:
    """The records of the selected tables (and heartbeats, always), as a trail file of
    their own: RBAs from 0 and transaction indicators rewritten at the new boundaries. A
    transaction that keeps no record disappears; one that keeps one record becomes WHOLE."""
    regex = heartbeat.selection(patterns)
    names = [n for n in pc.unique(table.column("table")).to_pylist() if n is not None and regex.fullmatch(n)]
    keep = pc.fill_null(pc.is_in(table.column("table"), pa.array(names, pa.string())), False)
    keep_np = np.asarray(keep.to_numpy(zero_copy_only=False), dtype=bool)
    starts = np.isin(table.column("trans_ind").to_numpy(), (trails.BEGIN, trails.WHOLE))
    transaction = np.cumsum(starts)[keep_np]
    kept = table.filter(pa.array(keep_np))
    count = len(kept)
    if count == 0:
        return kept
    first = np.ones(count, dtype=bool)
    first[1:] = transaction[1:] != transaction[:-1]
    last = np.ones(count, dtype=bool)
    last[:-1] = first[1:]
    indicator = np.where(first & last, trails.WHOLE,
                         np.where(first, trails.BEGIN, np.where(last, trails.END, trails.MIDDLE))).astype(np.int8)
    kept = kept.set_column(kept.schema.get_field_index("trans_ind"), "trans_ind", pa.array(indicator, pa.int8()))
    return kept.set_column(kept.schema.get_field_index("rba"), "rba", pa.array(np.arange(count), pa.int64()))
