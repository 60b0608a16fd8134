"""A chunk's net rows as apply reads them: `NetRows` indexes the COPY lines (the contract:
net/__init__.py) so that the lines of one (unit, table, step) are sent to the target as
one slice, and gathers each table's staged lines for its staging table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trailbound import copytext
from trailbound.replicat.net import STEP


@dataclass
class UnitTable:
    table: str
    staged: tuple[int, int, int] | None = None       # (part, first line, past the last)
    counts: dict[str, int] = field(default_factory=dict)
    inserts: tuple[int, int, int] | None = None
    unresolved: bool = False
    partial_updates: bool = False   # a U line whose mask leaves a column out (the target keeps its value)


class NetRows:
    """COPY lines for a chunk, as slices: the lines of one (unit, table, step) are one
    contiguous slice of one part's data buffer, sent as is. A part must hold each
    (unit, table, step) contiguously (Arrow-made lines do, table by table); Spark's are
    sorted first."""

    def __init__(self, parts: list[pa.Table]):
        self._buffers: list[tuple[memoryview, np.ndarray]] = []
        self.units: dict[int, list[UnitTable]] = {}
        self._entries: dict[tuple[int, str], UnitTable] = {}  # the same entries, found by (unit, table)
        self.staged: dict[str, memoryview] = {}   # per table: every staged line, led by its table and unit
        for table in parts:
            if len(table):
                self._add(table)
        self._stage(parts)

    def _stage(self, parts: list[pa.Table]) -> None:
        """The staging table's COPY text per table: the staged lines (step 1) of every
        part, each led by its table (COPY text) and unit: tables whose staging rows have
        the same types share a staging table (apply/serial.py)."""
        pieces: dict[str, list[pa.Buffer]] = {}
        for table in parts:
            if not len(table):
                continue
            staged = table.filter(pc.equal(table.column("step"), STEP["D"]))
            if not len(staged):
                continue
            # One pass for every table: a stable sort by table keeps each table's lines in
            # their order, and each table is then one slice (a filter per table cost
            # hundreds of passes over the chunk with hundreds of tables).
            names = staged.column("table").combine_chunks().dictionary_encode()
            codes = names.indices.to_numpy(zero_copy_only=False)
            order = np.argsort(codes, kind="stable")
            codes = codes[order]
            staged = staged.take(pa.array(order))
            led = pc.binary_join_element_wise(copytext.copy_values(staged.column("table")),
                                              staged.column("unit").cast(pa.string()), staged.column("line"),
                                              "\t").combine_chunks()
            dictionary = names.dictionary.to_pylist()
            cuts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1], True]).tolist()
            for a, b in zip(cuts[:-1], cuts[1:]):
                pieces.setdefault(dictionary[codes[a]], []).append(copytext.joined(led.slice(a, b - a)))
        self.staged = {name: memoryview(b"".join(buffers) if len(buffers) > 1 else buffers[0])
                       for name, buffers in pieces.items()}

    def _add(self, table: pa.Table) -> None:
        part = len(self._buffers)
        lines = table.column("line").combine_chunks()
        if not pa.types.is_large_string(lines.type):
            lines = lines.cast(pa.large_string())
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
        self._buffers.append((memoryview(lines.buffers()[2]) if lines.buffers()[2] is not None else memoryview(b""),
                              offsets))
        units = table.column("unit").to_numpy()
        steps = table.column("step").to_numpy()
        names = table.column("table").combine_chunks().dictionary_encode()
        codes = names.indices.to_numpy()
        dictionary = names.dictionary.to_pylist()
        # The kinds are counted for staged lines only: an insert-only part converts none.
        kinds = table.column("kind").to_numpy(zero_copy_only=False) if (steps == STEP["D"]).any() else None
        if kinds is not None:
            # A staged line starts with its kind and its mask: an update whose images
            # carried every column (a live source's, nearly always) needs no choice per
            # column between the staged and the target's value (apply/serial.py).
            partial = (kinds == "U") & ~pc.match_substring_regex(lines, r"^U\t1*\t").to_numpy(zero_copy_only=False)
        cuts = np.flatnonzero(np.r_[True, (units[1:] != units[:-1]) | (codes[1:] != codes[:-1]) |
                                    (steps[1:] != steps[:-1]), True])
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            entry = self.entry(int(units[a]), dictionary[codes[a]])
            step = int(steps[a])
            if step == 0:
                entry.unresolved = True
            elif step == 1:
                entry.staged = (part, a, b)
                found, counts = np.unique(kinds[a:b], return_counts=True)
                entry.counts = {str(k): int(c) for k, c in zip(found, counts)}
                entry.partial_updates = bool(partial[a:b].any())
            else:
                entry.inserts = (part, a, b)

    def entry(self, unit: int, table: str) -> UnitTable:
        """The (unit, table)'s entry, added (in the unit's order of tables) if new."""
        entry = self._entries.get((unit, table))
        if entry is None:
            entry = self._entries[unit, table] = UnitTable(table)
            self.units.setdefault(unit, []).append(entry)
        return entry

    def staged_to_merge(self) -> dict[str, memoryview]:
        """`staged` of the tables with staged lines the set-based merge reads: a (unit,
        table) left to replay record by record is applied from its records, so staging
        its lines would only cost round trips (a COPY per table: hundreds, on hundreds
        of keyless tables)."""
        tables = {entry.table for entries in self.units.values() for entry in entries
                  if entry.staged is not None and not entry.unresolved}
        return {name: payload for name, payload in self.staged.items() if name in tables}

    def tables(self) -> set[str]:
        """The source tables the chunk's net rows touch."""
        return {entry.table for entries in self.units.values() for entry in entries}

    def view(self, span: tuple[int, int, int] | None) -> memoryview | None:
        if span is None:
            return None
        part, a, b = span
        data, offsets = self._buffers[part]
        return data[int(offsets[a]):int(offsets[b])]
