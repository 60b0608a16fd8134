"""pgoutput's text values -> the archive's JSON values (docs/redo-archive.md): booleans and
integers as JSON, floats as JSON numbers (NaN and infinities, which JSON cannot hold, as
their text), every other type as its PostgreSQL text form, which the target's input
function reads back (numeric, timestamptz in UTC, bytea as hex, arrays, json, text).

The text forms depend on the walsender session's settings; reader.SESSION_OPTIONS fixes
them, so the conversion here never has to guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# pg_type oids of the built-in types whose JSON value is not a string
BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8 = 16, 21, 23, 20, 26, 700, 701


def _bool(text: str) -> bool:
    return text == "t"


def _float(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else text


CONVERTERS: dict[int, Callable[[str], object]] = {
    BOOL: _bool, INT2: int, INT4: int, INT8: int, OID: int, FLOAT4: _float, FLOAT8: _float,
}


def converter(type_oid: int) -> Callable[[str], object] | None:
    """How to turn a column's text into its JSON value; None: keep the text."""
    return CONVERTERS.get(type_oid)
