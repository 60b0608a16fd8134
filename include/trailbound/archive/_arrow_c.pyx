# cython: language_level=3, boundscheck=False, wraparound=False
"""A column of str or None as an Arrow string array's three buffers, in C.

writer._string_array's StringBuilder appends value by value (~1.7 us each: a third of a
segment's writing); here the UTF-8 of each str (which CPython keeps, for ASCII its very
characters) is copied once into one buffer and the offsets written beside it. The array,
and so the Parquet bytes, are the same (tests/test_archive_writer.py compares them).
Built by `make` (setup.py build_ext --inplace); without it writer.py uses StringBuilder.
"""

from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memcpy


def string_buffers(list values not None):
    """(validity bitmap or None, int32 offsets, UTF-8 data, null count) of `values`, or
    None past Arrow's 2 GiB of a string array (StringBuilder then makes it)."""
    cdef Py_ssize_t n = len(values), i, size, total = 0, nulls = 0
    cdef const char *text
    for value in values:
        if value is None:
            nulls += 1
        else:
            PyUnicode_AsUTF8AndSize(value, &size)  # a TypeError for anything not a str
            total += size
    if total > 0x7FFFFFFF:
        return None
    offsets = bytearray(4 * (n + 1))
    data = bytearray(total)
    validity = bytearray((n + 7) // 8) if nulls else None
    cdef int32_t *at = <int32_t *> <char *> offsets
    cdef char *out = <char *> data
    cdef uint8_t *valid = <uint8_t *> <char *> validity if nulls else NULL
    cdef int32_t end = 0
    at[0] = 0
    for i in range(n):
        value = values[i]
        if value is not None:
            text = PyUnicode_AsUTF8AndSize(value, &size)
            memcpy(out + end, text, size)
            end += <int32_t> size
            if nulls:
                valid[i >> 3] |= <uint8_t> (1 << (i & 7))
        at[i + 1] = end
    return validity, offsets, data, nulls
