"""Positions: small immutable value types with a text form that prints and parses back.

A bare int for an SCN or an offset mixes with counts and ids, so every place a position
crosses a boundary (the CLI, the metadata store, a log line) goes through one of these.

Text forms:
  Scn            "8440969"
  LogPosition    "1:47:68748800"          thread:sequence:rba
  Csn            "8440969@1:47:68748800"  commit scn @ position of the COMMIT record
  TrailPosition  "3:2142224"              trail seqno:rba

The trail's order is the CSN order, then each record's own log position. In columns
(trail files, Spark and Arrow tables) a CSN is the four CSN_COLUMNS; TRAIL_ORDER is the
full sort key, `Csn.from_row` reads a CSN back from a row or struct, and
`csn_at_or_below` compares many rows at once (Spark Columns or NumPy arrays alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

# A CSN as columns, most significant first (the order of Csn's fields).
CSN_COLUMNS = ("csn", "csn_thread", "csn_sequence", "csn_rba")
# The trail's order: the transaction's CSN, then the record's position in the log.
TRAIL_ORDER = CSN_COLUMNS + ("src_sequence", "src_rba")


def _ints(text: str, sep: str, count: int, what: str) -> list[int]:
    parts = text.strip().split(sep)
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != count or any(v < 0 for v in values):
        raise ValueError(f"{text!r} is not a {what}")
    return values


@dataclass(frozen=True, order=True)
class Scn:
    """A system change number: the source database's logical clock."""

    value: int

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        """The text form in a padded column too (`f"{scn:>12}"`)."""
        return format(str(self), spec)

    @classmethod
    def parse(cls, text: str) -> "Scn":
        return cls(*_ints(text, ":", 1, "SCN (a non-negative integer)"))


@dataclass(frozen=True, order=True)
class LogPosition:
    """Where a record sits in the redo archive: (thread, sequence, rba).

    Ordered within one thread; positions of different threads are compared by SCN.
    """

    thread: int
    sequence: int
    rba: int

    def __str__(self) -> str:
        return f"{self.thread}:{self.sequence}:{self.rba}"

    @classmethod
    def parse(cls, text: str) -> "LogPosition":
        return cls(*_ints(text, ":", 3, "log position (thread:sequence:rba)"))


@dataclass(frozen=True, order=True)
class Csn:
    """A transaction's commit sequence: the commit SCN, ties broken by the position of
    the COMMIT record (thread, sequence, rba). This is the order of the trail."""

    scn: int
    thread: int = 0
    sequence: int = 0
    rba: int = 0

    @classmethod
    def forced(cls, at: "Scn", k: int) -> "Csn":
        """FORCETRANS: an open transaction written as committed now, the k-th of a run
        reading below `at`. No real commit of the run is at or above `at`; thread 0
        (no redo thread) marks it forced."""
        return cls(at.value, 0, 0, k)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Csn":
        """The CSN of a trail row (a dict, Arrow row or Spark Row with CSN_COLUMNS)."""
        return cls(*(int(row[column]) for column in CSN_COLUMNS))

    def key(self) -> tuple[int, int, int, int]:
        """The CSN as a tuple in CSN_COLUMNS order: what it sorts by."""
        return (self.scn, self.thread, self.sequence, self.rba)

    @property
    def commit_position(self) -> LogPosition:
        return LogPosition(self.thread, self.sequence, self.rba)

    def __str__(self) -> str:
        return f"{self.scn}@{self.thread}:{self.sequence}:{self.rba}"

    @classmethod
    def parse(cls, text: str) -> "Csn":
        """Accepts the full form or a bare commit SCN (as users type it in
        `alter replicat ... atcsn N`), which sorts before every commit at that SCN."""
        scn, at, position = text.strip().partition("@")
        if not at:
            return cls(*_ints(scn, ":", 1, "CSN"))
        return cls(*_ints(scn, ":", 1, "CSN"), *_ints(position, ":", 3, "CSN (scn@thread:sequence:rba)"))


@dataclass(frozen=True, order=True)
class TrailPosition:
    """Where a record sits in a trail: (trail file seqno, rba = record ordinal in the file)."""

    seqno: int
    rba: int

    def __str__(self) -> str:
        return f"{self.seqno}:{self.rba}"

    @classmethod
    def parse(cls, text: str) -> "TrailPosition":
        return cls(*_ints(text, ":", 2, "trail position (seqno:rba)"))


def csn_at_or_below(columns: Sequence[Any], bound: Csn):
    """Rows whose CSN, given as four columns in CSN_COLUMNS order, sorts at or below
    `bound`: lexicographic, the ordering rule of Csn for many rows at once. Works on
    anything with elementwise <, == and & | (Spark Columns, NumPy arrays)."""
    values = bound.key()
    result = columns[-1] <= values[-1]
    for column, value in reversed(list(zip(columns[:-1], values[:-1]))):
        result = (column < value) | ((column == value) & result)
    return result
