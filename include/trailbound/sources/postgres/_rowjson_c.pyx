# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""rowjson.row_images compiled: a row change's bytes to its record's JSON images in C.

rowjson.py is the one definition of what a row change becomes; this is the same, for the
messages a pull nearly always gets (every value text or NULL, the relation's columns
integers, booleans or anything written as a JSON string, the message up to 1 MiB), with
no Python object made per column: the tuples are walked and the images written into one
buffer, which becomes the image's str at the end. Anything else (an unchanged TOASTed
value, a float column, a value in binary, a malformed message, bytes that are not UTF-8)
goes to rowjson's `_row_images`, which gives the same text or names the byte where the
message goes wrong. tests/test_pg_miner.py checks the two against each other.

Built by `make` (setup.py build_ext --inplace); without it rowjson.py runs alone.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy

# rowjson's column kinds (rowjson._NUMBER, _BOOLEAN, _FLOAT, _STRING)
cdef enum:
    NUMBER = 0
    BOOLEAN = 1
    STRING = 3

# A larger message goes to rowjson.py: the buffer an image is written into holds up to six
# times the message (every byte escaped) and stays, so it stays small.
cdef Py_ssize_t MOST = 1 << 20

# rowjson sets this to its pure-Python row_images: what a message this module does not do goes to.
fallback = None

# JSON's escapes of a byte in a string (json.encoder.encode_basestring, ensure_ascii=False):
# 0 copied as it is, 1 \u00XX, any other the letter after the backslash.
cdef unsigned char ESCAPE[256]
for _byte in range(256):
    ESCAPE[_byte] = 1 if _byte < 0x20 else 0
ESCAPE[0x22], ESCAPE[0x5C] = 0x22, 0x5C                                     # " and \
ESCAPE[0x08], ESCAPE[0x0C], ESCAPE[0x0A], ESCAPE[0x0D], ESCAPE[0x09] = 0x62, 0x66, 0x6E, 0x72, 0x74  # b f n r t
cdef const char *HEX = b"0123456789abcdef"


cdef class Shape:
    """One relation as rowjson.RowJson describes it: each column's kind, each column's
    `"name":` in UTF-8, the key's positions; and room for one change's two tuples."""

    cdef Py_ssize_t width, key_width, keys_size
    cdef unsigned char *kinds
    cdef list names            # bytes: '"name":' per column
    cdef Py_ssize_t *key
    cdef Py_ssize_t *starts    # per column of a tuple read: its value's first byte, -1 NULL
    cdef Py_ssize_t *ends

    def __cinit__(self, kinds, keys, key):
        self.width, self.key_width = len(kinds), len(key)
        self.kinds = <unsigned char *> PyMem_Malloc(max(self.width, 1))
        self.key = <Py_ssize_t *> PyMem_Malloc(max(self.key_width, 1) * sizeof(Py_ssize_t))
        self.starts = <Py_ssize_t *> PyMem_Malloc(max(2 * self.width, 1) * sizeof(Py_ssize_t))
        self.ends = <Py_ssize_t *> PyMem_Malloc(max(2 * self.width, 1) * sizeof(Py_ssize_t))
        if not (self.kinds and self.key and self.starts and self.ends):
            raise MemoryError()
        self.names = [name.encode("utf-8") for name in keys]
        self.keys_size = sum(len(name) for name in self.names)
        for i, kind in enumerate(kinds):
            self.kinds[i] = kind
        for i, position in enumerate(key):
            self.key[i] = position

    def __dealloc__(self):
        PyMem_Free(self.kinds)
        PyMem_Free(self.key)
        PyMem_Free(self.starts)
        PyMem_Free(self.ends)


# The one buffer images are written into (the pull holds the GIL throughout), grown as needed.
cdef char *out = NULL
cdef Py_ssize_t out_size = 0


cdef int _room(Py_ssize_t size) except -1:
    global out, out_size
    cdef char *grown
    if size > out_size:
        grown = <char *> PyMem_Realloc(out, size)
        if grown == NULL:
            raise MemoryError()
        out, out_size = grown, size
    return 0


cdef inline unsigned int _u32(const unsigned char *p) noexcept:
    return (<unsigned int> p[0] << 24) | (<unsigned int> p[1] << 16) | (<unsigned int> p[2] << 8) | p[3]


cdef Py_ssize_t _tuple(Shape shape, const unsigned char *p, Py_ssize_t at, Py_ssize_t size, Py_ssize_t base) noexcept:
    """The tuple at `at` into shape.starts/ends[base:base + width]: the position after it,
    or -1 for anything this module leaves to rowjson.py."""
    cdef Py_ssize_t i, length, start
    cdef unsigned char marker
    if at + 2 > size or ((p[at] << 8) | p[at + 1]) != shape.width:
        return -1
    at += 2
    for i in range(base, base + shape.width):
        if at >= size:
            return -1
        marker = p[at]
        if marker == 0x74:  # 't'
            if at + 5 > size:
                return -1
            length = _u32(p + at + 1)
            start = at + 5
            if length > size - start:
                return -1
            shape.starts[i], shape.ends[i] = start, start + length
            at = start + length
        elif marker == 0x6E:  # 'n'
            shape.starts[i] = -1
            at += 1
        else:  # 'u' (an unchanged TOASTed value: a sparse image) or 'b'
            return -1
    return at


cdef object _image(Shape shape, const unsigned char *p, Py_ssize_t size, Py_ssize_t base, bint key_only):
    """The tuple read at `base` as its image (every column, or the key's): a str, or None
    when rowjson.py is to make it (bytes that are not UTF-8, or not ASCII in a number)."""
    cdef Py_ssize_t count = shape.key_width if key_only else shape.width
    cdef Py_ssize_t n, column, i, start, end, length
    cdef unsigned char byte, escape, kind
    cdef bytes name
    _room(2 + shape.keys_size + 5 * count + 6 * size)
    cdef char *w = out
    w[0] = b"{"
    w += 1
    for n in range(count):
        column = shape.key[n] if key_only else n
        if n:
            w[0] = b","
            w += 1
        name = <bytes> shape.names[column]
        memcpy(w, <const char *> name, len(name))
        w += len(name)
        start, end = shape.starts[base + column], shape.ends[base + column]
        if start < 0:
            memcpy(w, b"null", 4)
            w += 4
            continue
        kind = shape.kinds[column]
        if kind == STRING:
            w[0] = b'"'
            w += 1
            for i in range(start, end):
                byte = p[i]
                escape = ESCAPE[byte]
                if escape == 0:
                    w[0] = byte
                    w += 1
                elif escape == 1:
                    memcpy(w, b"\\u00", 4)
                    w[4], w[5] = HEX[byte >> 4], HEX[byte & 15]
                    w += 6
                else:
                    w[0], w[1] = b"\\", escape
                    w += 2
            w[0] = b'"'
            w += 1
        elif kind == NUMBER:  # its text is its JSON (rowjson reads it as Latin-1: ASCII only here)
            for i in range(start, end):
                if p[i] >= 0x80:
                    return None
            length = end - start
            memcpy(w, p + start, length)
            w += length
        else:  # BOOLEAN
            if end - start == 1 and p[start] == 0x74:
                memcpy(w, b"true", 4)
                w += 4
            else:
                memcpy(w, b"false", 5)
                w += 5
    w[0] = b"}"
    w += 1
    try:
        return PyUnicode_DecodeUTF8(out, w - out, NULL)
    except UnicodeDecodeError:
        return None


def row_images(bytes data not None, bint in_stream, dict shapes, dict readers):
    """rowjson._row_images: (kind byte, xid or None, relation oid, before image, after image)."""
    cdef const unsigned char *p = <const unsigned char *> data
    cdef Py_ssize_t size = len(data), at
    cdef unsigned char kind, part, old_kind = 0
    cdef unsigned int oid
    cdef object xid = None, before = None, after = None
    cdef Shape shape
    cdef Py_ssize_t width
    if size < 10 or size > MOST:
        return fallback(data, in_stream, shapes, readers)
    kind = p[0]
    if in_stream:
        xid, oid, at = _u32(p + 1), _u32(p + 5), 9
    else:
        oid, at = _u32(p + 1), 5
    row_json = shapes.get(oid)
    shape = None if row_json is None else row_json.compiled
    if shape is None:
        return fallback(data, in_stream, shapes, readers)
    part = p[at]
    at += 1
    width = shape.width
    if kind == 0x49:  # 'I'
        if part != 0x4E:
            return fallback(data, in_stream, shapes, readers)
        at = _tuple(shape, p, at, size, 0)
    elif kind == 0x55:  # 'U': the old key ('K') or row ('O') at width, the new tuple at 0
        if part == 0x4B or part == 0x4F:
            old_kind = part
            at = _tuple(shape, p, at, size, width)
            if at < 0 or at >= size:
                return fallback(data, in_stream, shapes, readers)
            part = p[at]
            at += 1
        if part != 0x4E:
            return fallback(data, in_stream, shapes, readers)
        at = _tuple(shape, p, at, size, 0)
    else:  # 'D'
        if part != 0x4B and part != 0x4F:
            return fallback(data, in_stream, shapes, readers)
        old_kind = part
        at = _tuple(shape, p, at, size, width)
    if at != size:
        return fallback(data, in_stream, shapes, readers)
    if kind == 0x49:
        after = _image(shape, p, size, 0, False)
        if after is None:
            return fallback(data, in_stream, shapes, readers)
    elif kind == 0x55:
        after = _image(shape, p, size, 0, False)
        if old_kind == 0x4F:
            before = _image(shape, p, size, width, False)
        else:
            before = _image(shape, p, size, width if old_kind == 0x4B else 0, True)
        if after is None or before is None:
            return fallback(data, in_stream, shapes, readers)
    else:
        before = _image(shape, p, size, width, old_kind == 0x4B)
        if before is None:
            return fallback(data, in_stream, shapes, readers)
    return kind, xid, oid, before, after
