"""Lsn: a PostgreSQL WAL position (log sequence number), a small immutable value type.

Its text form is PostgreSQL's own, `16/B374D848` (two hexadecimal halves of a 64-bit
integer); the redo archive uses the integer itself as the SCN (docs/live-postgres.md):
`lsn.scn` and `Lsn.of(scn)` cross between the two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trailbound.positions import Scn

_TEXT = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")


@dataclass(frozen=True, order=True)
class Lsn:
    value: int

    def __post_init__(self) -> None:
        if not 0 <= self.value < 1 << 64:
            raise ValueError(f"{self.value} is not a WAL position (0 to 2^64-1)")

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __int__(self) -> int:
        return self.value

    @property
    def scn(self) -> Scn:
        """This position as the archive's SCN (the same integer)."""
        return Scn(self.value)

    @classmethod
    def of(cls, scn: Scn) -> "Lsn":
        """The WAL position an archive SCN of this source stands for."""
        return cls(scn.value)

    @classmethod
    def parse(cls, text: str) -> "Lsn":
        match = _TEXT.match(text)
        if not match:
            raise ValueError(f"{text!r} is not an LSN like 16/B374D848")
        return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))


ZERO = Lsn(0)
