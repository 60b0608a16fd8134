# cython: language_level=3, boundscheck=False, wraparound=False
"""reader.py's per-message loops compiled: cutting the stream into messages, and finding
the transaction boundaries in a batch of them.

reader.py is their definition and does the same without this module; a pull cuts and scans
every message (a quarter of a million for 200,000 changes), ~2.5 us each in Python. `cut`
takes only the frames a pull nearly always gets (XLogData, keepalives, whole and well
formed) and stops at the first other one, which reader.py's own loop takes from there.
tests/test_pg_pull_stream.py checks the two against each other. Built by `make`.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize


cdef inline unsigned long long _u64(const unsigned char *p) noexcept:
    cdef unsigned long long value = 0
    cdef int i
    for i in range(8):
        value = (value << 8) | p[i]
    return value


cdef inline unsigned int _u32(const unsigned char *p) noexcept:
    return (<unsigned int> p[0] << 24) | (<unsigned int> p[1] << 16) | (<unsigned int> p[2] << 8) | p[3]


def cut(bytes data not None, list messages not None, wal_end):
    """Every whole XLogData ('w') and keepalive ('k') CopyData frame from the start of
    `data`: each XLogData's (data_start, wal_end, send_time, payload) appended to
    `messages`. Returns (the position of the first frame left to reader.py: incomplete,
    or of another kind), the last WAL end sent, whether a keepalive asked for a reply)."""
    cdef const unsigned char *p = <const unsigned char *> data
    cdef Py_ssize_t end = len(data), at = 0, stop
    cdef unsigned long long size
    cdef bint reply = False
    cdef unsigned char inner
    while end - at >= 5:
        size = _u32(p + at + 1)
        if p[at] != 0x64 or size > <unsigned long long> (end - at - 1):  # not CopyData, or not whole
            break
        stop = at + 1 + <Py_ssize_t> size
        inner = p[at + 5] if stop > at + 5 else 0
        if inner == 0x77 and stop >= at + 30:  # 'w': XLogData
            wal_end = _u64(p + at + 14)
            messages.append((_u64(p + at + 6), wal_end, <long long> _u64(p + at + 22),
                             PyBytes_FromStringAndSize(<const char *> p + at + 30, stop - at - 30)))
        elif inner == 0x6B and stop >= at + 23:  # 'k': the primary's keepalive
            wal_end = _u64(p + at + 6)
            reply = reply or p[at + 22] != 0
        else:
            break
        at = stop
    return at, wal_end, reply


def scan(list batch not None, bint boundary, safe, end):
    """reader._scan: (at a boundary after the batch, the safe position, how many of the
    batch's messages to take when the stream is read up to `end`, else 0)."""
    cdef Py_ssize_t at
    cdef unsigned char kind
    cdef bytes payload
    for at in range(len(batch)):
        message = batch[at]
        payload = <bytes> (<tuple> message)[3]
        kind = payload[0] if len(payload) else 0
        if kind == 0x42 or kind == 0x53:  # Begin, Stream Start: what is sent of a transaction opens
            boundary = False
        elif kind == 0x43 or kind == 0x45:  # Commit, Stream Stop: it closes
            boundary = True
            wal_end = (<tuple> message)[1]
            if wal_end > safe:
                safe = wal_end
            if safe >= end:
                return boundary, safe, at + 1
    return boundary, safe, 0
