"""pgoutput TupleData bytes straight to the archive's JSON images: the pull's hot path.

The decoder turns a tuple into Python values, and values.py and the JSON encoder turn
those into the archive's text; per row that is a tuple, a dict and a str per column, and
nearly all of a pull's time. Here a tuple is read once into one piece of JSON per column,
`"name":value` as UTF-8 bytes, from which the row's image and its key's image are joined:
an integer's text is its JSON already, a text value needs quotes (and escapes, only when
it holds a quote, a backslash or a control character), a boolean is true or false. The
result is the very text the slower path gives (`encode_json` of `values.converter`'s
values), which tests/test_pg_miner.py checks value by value.
"""

from __future__ import annotations

import json
import re
import struct

from trailbound.archive.writer import encode_json
from trailbound.sources.postgres.decoder import DecodeError
from trailbound.sources.postgres.values import BOOL, FLOAT4, FLOAT8, INT2, INT4, INT8, OID, _float

_INT16, _INT32 = struct.Struct("!h"), struct.Struct("!i")
_TEXT, _NULL, _UNCHANGED_TOAST = 0x74, 0x6E, 0x75  # 't', 'n', 'u'
_NEEDS_ESCAPE = re.compile(rb'["\\\x00-\x1f]').search
_quote = json.encoder.encode_basestring  # the encoder's own (ensure_ascii=False)

# How a column's text becomes JSON
_NUMBER, _BOOLEAN, _FLOAT, _STRING = 0, 1, 2, 3
_KINDS = {INT2: _NUMBER, INT4: _NUMBER, INT8: _NUMBER, OID: _NUMBER, BOOL: _BOOLEAN, FLOAT4: _FLOAT, FLOAT8: _FLOAT}


class RowJson:
    """One relation's columns: each one's `"name":` prefix and how its value is written."""

    __slots__ = ("keys", "kinds", "key", "width")

    def __init__(self, names: tuple[str, ...], type_oids: tuple[int, ...], key: tuple[int, ...]):
        self.keys = tuple((_quote(name) + ":").encode() for name in names)
        self.kinds = tuple(_KINDS.get(oid, _STRING) for oid in type_oids)
        self.key = key
        self.width = len(names)

    def pieces(self, data: bytes, at: int) -> tuple[list, int]:
        """The tuple at `at`: one `"name":value` per column (None for an unchanged TOASTed
        value, which the image leaves out), and the position after it."""
        (count,) = _INT16.unpack_from(data, at)
        if count != self.width:
            raise DecodeError(f"a tuple of {count} column(s) at byte {at}, the relation has {self.width}")
        at += 2
        size = len(data)
        keys, kinds = self.keys, self.kinds
        out = []
        append = out.append
        for column in range(count):
            marker = data[at]
            at += 1
            if marker == _TEXT:
                (length,) = _INT32.unpack_from(data, at)
                at += 4
                end = at + length
                if length < 0 or end > size:
                    raise DecodeError(f"value of {length} bytes runs past the message end at byte {at}")
                raw = data[at:end]
                at = end
                kind = kinds[column]
                if kind == _STRING:
                    if _NEEDS_ESCAPE(raw):
                        append(keys[column] + _quote(str(raw, "utf-8")).encode())
                    else:
                        append(b"".join((keys[column], b'"', raw, b'"')))
                elif kind == _NUMBER:
                    append(keys[column] + raw)
                elif kind == _BOOLEAN:
                    append(keys[column] + (b"true" if raw == b"t" else b"false"))
                else:
                    append(keys[column] + encode_json(_float(str(raw, "ascii"))).encode())
            elif marker == _NULL:
                append(keys[column] + b"null")
            elif marker == _UNCHANGED_TOAST:
                append(None)
            else:
                raise DecodeError(f"tuple value kind {chr(marker)!r} at byte {at - 1} (the miner asks for text)")
        return out, at


def image(pieces: list) -> str:
    """The row's JSON: every column sent (an unchanged TOASTed one is absent: it keeps its value)."""
    if None in pieces:
        pieces = [piece for piece in pieces if piece is not None]
    return str(b"{" + b",".join(pieces) + b"}", "utf-8")


def key_image(pieces: list, key: tuple[int, ...]) -> str:
    return str(b"{" + b",".join([pieces[i] for i in key]) + b"}", "utf-8")
