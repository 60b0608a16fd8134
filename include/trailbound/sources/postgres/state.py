"""The miner's own state: what it needs to recognise a change the slot sends again.

A slot restarts from its confirmed position, which may lie before what the archive holds
(a pull killed after writing segments and before confirming) and always lies before an
open transaction's start, whose streamed changes it sends again. So the miner remembers,
per top-level transaction it has archived records of, the position of the last change it
archived (an LSN and how many changes at that LSN: COPY logs many rows in one WAL record),
the subtransactions it archived changes of (their first and last LSN) and a ROLLBACK for,
and whether it archived the end.

The state is written beside the segments, one file per segment, `.pgminer/state_<S>.json`,
BEFORE segment S's manifest: it describes exactly segments 1..S. On start the miner loads
the state of the archive's last visible segment; a state file past it (a pull killed
between the state and the manifest) describes a segment that never became visible and is
removed. So a kill anywhere neither loses nor duplicates a record.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from trailbound.archive import segments as archive_segments
from trailbound.archive.writer import encode_json, format_time
from trailbound.durable import atomic_write
from trailbound.errors import TrailboundError
from trailbound.sources.postgres.lsn import Lsn

STATE_DIR = ".pgminer"
_STATE_RE = re.compile(r"^state_(\d{9})\.json$")
THREAD = 1  # one database server: one redo thread


@dataclass
class Txn:
    """A top-level transaction the archive holds records of.

    Its LSNs are plain ints, as the state file holds them: the miner updates them for
    every change it reads (its inner loop), where an Lsn per change would cost a pull its
    speed. Lsn goes in and out at the miner's functions (MinerState.forget_ended_before)."""

    last_lsn: int = 0          # the last archived change's LSN
    at_last_lsn: int = 0       # how many changes at that LSN are archived
    streamed: bool = False     # its records came before its commit
    ended: int | None = None   # LSN of its archived COMMIT or ROLLBACK
    first_time: str | None = None
    aborted_subxids: list[int] = field(default_factory=list)
    subxids: dict[str, list[int]] = field(default_factory=dict)  # archived subtransaction -> [first, last] LSN


@dataclass
class MinerState:
    sequence: int              # the last segment these describe (0: none yet)
    next_scn: Lsn              # that segment's next_scn (or the slot's consistent point)
    next_time: datetime
    slot: str
    txns: dict[int, Txn] = field(default_factory=dict)
    # Gaps the user accepted (`alter source --accept-gap`), oldest first: {"from", "to"
    # (LSNs, X/Y), "segment", "accepted" (UTC time), "reason", "closed" (xids)}. Carried into
    # every later state, so `info source` shows them as long as the archive exists.
    gaps: list[dict] = field(default_factory=list)
    # Each ended transaction's text in the state file, by xid: an ended transaction does not
    # change again, and a pull saves the state with every segment (encoding the tens of
    # thousands it lists again each time cost a pull 10%).
    _ended_text: dict[int, tuple[Txn, str]] = field(default_factory=dict, repr=False, compare=False)

    def to_text(self) -> str:
        """The state file's JSON (compact; the transactions last)."""
        head = encode_json({"sequence": self.sequence, "next_scn": self.next_scn.value,
                            "next_time": format_time(self.next_time), "slot": self.slot, "gaps": self.gaps})
        # In the order the transactions were first seen: sorting 100,000s of them for every
        # segment cost a pull 2% (and xids wrap around: their order says little).
        return head[:-1] + ',"txns":{' + ",".join(map(self._txn_text, self.txns.items())) + "}}"

    def _txn_text(self, item: tuple[int, Txn]) -> str:
        xid, txn = item
        if txn.ended is None:
            return f'"{xid}":{_txn_json(txn)}'
        known = self._ended_text.get(xid)
        if known is None or known[0] is not txn:
            known = self._ended_text[xid] = (txn, f'"{xid}":{_txn_json(txn)}')
        return known[1]

    @classmethod
    def from_json(cls, document: dict) -> "MinerState":
        return cls(document["sequence"], Lsn(document["next_scn"]), datetime.fromisoformat(document["next_time"]),
                   document["slot"], {int(xid): Txn(**txn) for xid, txn in document["txns"].items()},
                   document.get("gaps", []))

    def open_streamed(self) -> dict[int, Txn]:
        return {xid: txn for xid, txn in self.txns.items() if txn.ended is None}

    def forget_ended_before(self, lsn: Lsn) -> None:
        """The slot never sends again a transaction that ended before its confirmed position."""
        below = lsn.value
        self.txns = {xid: txn for xid, txn in self.txns.items() if txn.ended is None or txn.ended >= below}
        self._ended_text.clear()


def _txn_json(txn: Txn) -> str:
    """encode_json(vars(txn)), the text written directly for a transaction without
    subtransactions (nearly all: encoding their dicts was half of writing the state)."""
    if txn.aborted_subxids or txn.subxids:
        return encode_json(vars(txn))
    return (f'{{"last_lsn":{txn.last_lsn},"at_last_lsn":{txn.at_last_lsn},'
            f'"streamed":{"true" if txn.streamed else "false"},"ended":{"null" if txn.ended is None else txn.ended},'
            f'"first_time":{"null" if txn.first_time is None else _quote(txn.first_time)},'
            '"aborted_subxids":[],"subxids":{}}')


_quote = json.encoder.encode_basestring  # the encoder's own (ensure_ascii=False), as encode_json's


def state_dir(archive: Path) -> Path:
    return archive / STATE_DIR


def state_path(archive: Path, sequence: int) -> Path:
    return state_dir(archive) / f"state_{sequence:09d}.json"


def save(archive: Path, state: MinerState) -> Path:
    # Compact: the state lists every transaction ended since the slot's confirmed position
    # (tens of thousands in a large pull), and indented JSON is encoded in pure Python.
    return write_text(archive, state.sequence, state.to_text())


def write_text(archive: Path, sequence: int, text: str) -> Path:
    """The state file of segment `sequence`, given its text (MinerState.to_text)."""
    path = state_path(archive, sequence)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (text + "\n").encode())
    return path


def last_sequence(archive: Path) -> int:
    """The archive's last visible segment of thread 1 (0: none)."""
    sequences = [s.sequence for s in archive_segments.discover(archive) if s.thread == THREAD]
    return max(sequences, default=0)


def load(archive: Path) -> MinerState:
    """The state describing the archive's last visible segment; state files past it
    (written before a manifest that never came) are removed, older ones but the
    previous are pruned."""
    directory = state_dir(archive)
    if not directory.is_dir():
        raise TrailboundError(f"{directory}: no miner state; `trailbound add source` creates it")
    states = sorted(int(m.group(1)) for m in map(_STATE_RE.match, os.listdir(directory)) if m)
    visible = last_sequence(archive)
    if visible == 0 and any(states):
        # Every segment file is gone (purged): which state was the last visible one is unknowable.
        raise TrailboundError(f"{archive}: no segment is left but the miner state says some were written; restore "
                              "the archive's last segment (its manifest) before pulling")
    if visible not in states:
        raise TrailboundError(f"{state_path(archive, visible)}: the miner state of segment {visible}, the archive's "
                              "last, is missing; the archive was not written by this source's pulls")
    for sequence in states:
        if sequence > visible or sequence < visible - 1:
            state_path(archive, sequence).unlink(missing_ok=True)
    try:
        return MinerState.from_json(json.loads(state_path(archive, visible).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrailboundError(f"{state_path(archive, visible)}: unreadable miner state ({exc})") from None
