"""What counting operations per table costs (STATS, trailbound.runcounts.count_ops):
replicat's count per chunk of CHUNK_RECORDS (300,000) trail records (table, op), and the
per-batch count a capture task runs as its batches pass (file_no, table, op), beside
Arrow's own group-by on the same columns (the first version's way).

    PYTHONPATH=include:tests python tests/bench/bench_run_counts.py [records]

Prints the medians of 7 runs; results in docs/benchmarks/run-counts.md."""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound.runcounts import count_ops


def chunk(records: int, tables: int = 20, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    names = np.array([f"shop.table_{i:02d}" for i in range(tables)])
    ops = np.array(["INSERT", "UPDATE", "DELETE"])
    groups = np.repeat(np.arange(records // 1000 + 1), 1000)[:records]  # GROUPTRANSOPS 1000
    return pa.table({"group": groups, "table": names[rng.integers(0, tables, records)],
                     "op": ops[rng.integers(0, 3, records)], "file_no": np.zeros(records, dtype=np.int64)})


def integer_codes(table: pa.Table) -> list[tuple]:
    """The alternative measured: each string column dictionary-encoded, the codes combined
    into one integer and counted with numpy's bincount."""
    combined, decoders = np.zeros(len(table), dtype=np.int64), []
    for name in ("table", "op"):
        encoded = pc.dictionary_encode(table.column(name).combine_chunks())
        names = encoded.dictionary.to_pylist()
        combined = combined * len(names) + encoded.indices.to_numpy().astype(np.int64)
        decoders.append(names)
    counts = np.bincount(combined)
    width = len(decoders[1])
    return [(decoders[0][k // width], decoders[1][k % width], int(counts[k])) for k in np.flatnonzero(counts)]


def median_seconds(function, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    table = chunk(records)
    plain = table.select(["table", "op"])
    per_chunk = median_seconds(lambda: count_ops(plain))
    arrow = median_seconds(lambda: integer_codes(plain))
    per_group = median_seconds(lambda: count_ops(table, keys=("group",)))
    batches = table.to_batches(max_chunksize=10_000)
    per_batch = median_seconds(lambda: [count_ops(b, keys=("file_no",)) for b in batches])
    print(f"{records} records, 20 tables, 3 ops")
    for what, seconds in (("replicat, per chunk (table, op)", per_chunk),
                          ("  the same, as integer codes counted by numpy", arrow),
                          ("  per group of 1,000 records (group, table, op)", per_group),
                          ("capture task, per 10,000-record batch (file_no, table, op)", per_batch)):
        print(f"{what:<60} {seconds * 1000:8.1f} ms {seconds / records * 1e9:6.0f} ns/record")


if __name__ == "__main__":
    main()
