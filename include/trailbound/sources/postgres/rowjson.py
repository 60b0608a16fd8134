"""pgoutput TupleData bytes straight to the archive's JSON images: the pull's hot path.

The decoder turns a tuple into Python values, and values.py and the JSON encoder turn
those into the archive's text; per row that is a tuple, a dict and a str per column, and
nearly all of a pull's time. Here a tuple is read once into one str per column, the
column's JSON value: an integer's text is its JSON already, a text value is quoted (and
escaped) by the JSON encoder's own C function, a boolean is true or false, NULL is null.
A row's image is then one %-format of the relation's template, `{"a":%s,"b":%s}`, and its
key's image one format of the key's. The result is the very text the slower path gives
(`encode_json` of `values.converter`'s values), which tests/test_pg_miner.py checks value
by value.

The values are sliced from the message read as Latin-1, one character per byte, so that a
byte offset is a character offset: for a message of ASCII only (nearly all) that is its
text; in any other, a text value's bytes are decoded as UTF-8 before they are quoted.
(Quoting touches only ASCII characters, which UTF-8 never uses inside a multi-byte one.)

`row_images` is a whole row change's images; _rowjson_c.pyx does the same in C when it
was built (`make`), and hands what it does not do back to `_row_images` here.
"""

from __future__ import annotations

import json
import struct
from operator import itemgetter

from trailbound.archive.writer import encode_json
from trailbound.sources.postgres.decoder import DecodeError, row_change
from trailbound.sources.postgres.values import BOOL, FLOAT4, FLOAT8, INT2, INT4, INT8, OID, _float

_INT16 = struct.Struct("!h")
_LENGTH = struct.Struct("!I").unpack_from  # unsigned: a length past the message shows at the end
_quote = json.encoder.encode_basestring  # the encoder's own (ensure_ascii=False)


def _quote_utf8(latin1: str) -> str:
    return _quote(str(latin1.encode("latin-1"), "utf-8"))


# How a column's text becomes JSON
_NUMBER, _BOOLEAN, _FLOAT, _STRING = 0, 1, 2, 3
_KINDS = {INT2: _NUMBER, INT4: _NUMBER, INT8: _NUMBER, OID: _NUMBER, BOOL: _BOOLEAN, FLOAT4: _FLOAT, FLOAT8: _FLOAT}


class RowJson:
    """One relation's columns: how each value is written, and the templates of its row's
    and its key's images."""

    __slots__ = ("kinds", "keys", "template", "key", "key_keys", "key_template", "_pick", "values", "compiled")

    def __init__(self, names: tuple[str, ...], type_oids: tuple[int, ...], key: tuple[int, ...]):
        self.kinds = tuple(_KINDS.get(oid, _STRING) for oid in type_oids)
        self.keys = tuple(_quote(name) + ":" for name in names)
        self.template = _template(self.keys)
        self.key = key
        self.key_keys = tuple(self.keys[i] for i in key)
        self.key_template = _template(self.key_keys)
        # the key's values as a tuple (itemgetter gives one column's value bare)
        pick = itemgetter(*key) if key else (lambda values: ())
        self._pick = pick if len(key) != 1 else (lambda values: (pick(values),))
        # values(data, at): the tuple at `at`, each column's JSON value (None for an
        # unchanged TOASTed value, which the image leaves out), and the position after it
        self.values = _reader(self.kinds)
        # the relation for _rowjson_c, which writes no float (rowjson's _float is the one definition)
        self.compiled = Shape(self.kinds, self.keys, key) if Shape is not None and _FLOAT not in self.kinds else None

    def image(self, values: list) -> str:
        """The row's JSON: every column sent (an unchanged TOASTed one is absent: it keeps its value)."""
        if None in values:
            return _sparse(self.keys, values)
        return self.template % tuple(values)

    def key_image(self, values: list) -> str:
        picked = self._pick(values)
        if None in picked:
            return _sparse(self.key_keys, picked)
        return self.key_template % picked


def _row_images(data: bytes, in_stream: bool, shapes: dict[int, RowJson], readers: dict):
    """A row change's record images: (kind byte, xid (streamed) or None, relation oid, before, after).
    `shapes`: relation oid -> its RowJson; `readers`: oid -> its RowJson.values."""
    kind, xid, oid, old_kind, old, new = row_change(data, in_stream, readers)
    images = shapes[oid]
    if kind == 0x49:  # 'I'
        return kind, xid, oid, None, images.image(new)
    if kind == 0x55:  # 'U': the old key ('K', the key changed), the old row ('O'), else the new key
        before = images.image(old) if old_kind == 0x4F else images.key_image(old if old_kind == 0x4B else new)
        return kind, xid, oid, before, images.image(new)
    # 'D'
    return kind, xid, oid, images.key_image(old) if old_kind == 0x4B else images.image(old), None


# The same in C when it was built (make; setup.py), this module's code for what it leaves out.
try:
    from trailbound.sources.postgres import _rowjson_c
except ImportError:
    Shape, row_images = None, _row_images
else:
    _rowjson_c.fallback = _row_images
    Shape, row_images = _rowjson_c.Shape, _rowjson_c.row_images


# A tuple's columns are read by a function made for the relation's column kinds, its column
# loop unrolled: per column, no loop step, no test of the column's kind, no append. (Reading
# tuples is most of a pull's work; this halves it.) Each column's value goes to v<i>:
_COLUMN = """
        marker = data[at]
        if marker == 0x74:  # 't': text
            start = at + 5
            at = start + length(data, at + 1)[0]
            v{i} = {value}
        elif marker == 0x6E:  # 'n': NULL
            at += 1
            v{i} = "null"
        elif marker == 0x75:  # 'u': an unchanged TOASTed value
            at += 1
            v{i} = None
        else:
            raise DecodeError(f"tuple value kind {{chr(marker)!r}} at byte {{at}} (the miner asks for text)")"""
_VALUE = {_STRING: "quote(text[start:at])", _NUMBER: "text[start:at]",
          _BOOLEAN: '"true" if text[start:at] == "t" else "false"', _FLOAT: "encode_json(_float(text[start:at]))"}
_READER = """
def values(data, at):
    if data[at:at + 2] != {count!r}:
        _wrong_count(data, at, {width})
    at += 2
    start = at
    text = str(data, "latin-1")
    quote = _quote if data.isascii() else _quote_utf8
    try:{columns}
    except (struct.error, IndexError):
        raise DecodeError(f"message ends early at byte {{at}}") from None
    except UnicodeDecodeError:
        raise DecodeError(f"the text value at byte {{start}} is not UTF-8") from None
    if at > len(data):
        raise DecodeError(f"the value at byte {{start}} runs past the message end (byte {{len(data)}})")
    return ({values}), at
"""


def _reader(kinds: tuple[int, ...]):
    source = _READER.format(count=_INT16.pack(len(kinds)), width=len(kinds),
                            columns="".join(_COLUMN.format(i=i, value=_VALUE[kind]) for i, kind in enumerate(kinds)),
                            values="".join(f"v{i}, " for i in range(len(kinds))))
    namespace = {"struct": struct, "length": _LENGTH, "DecodeError": DecodeError, "_wrong_count": _wrong_count,
                 "_quote": _quote, "_quote_utf8": _quote_utf8, "encode_json": encode_json, "_float": _float}
    exec(compile(source, f"<rowjson reader of {len(kinds)} column(s)>", "exec"), namespace)
    return namespace["values"]


def _wrong_count(data: bytes, at: int, width: int):
    try:
        (count,) = _INT16.unpack_from(data, at)
    except struct.error:
        raise DecodeError(f"message ends early at byte {at}") from None
    raise DecodeError(f"a tuple of {count} column(s) at byte {at}, the relation has {width}")


def _template(keys: tuple[str, ...]) -> str:
    return "{" + ",".join(key.replace("%", "%%") + "%s" for key in keys) + "}"


def _sparse(keys: tuple[str, ...], values) -> str:
    return "{" + ",".join(key + value for key, value in zip(keys, values) if value is not None) + "}"
