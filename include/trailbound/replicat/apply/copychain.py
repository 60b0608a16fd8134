"""A parallel session's group as one query: its COPYs chained, its checkpoint row and
COMMIT riding on the last COPY's end (and, on the run's own session, a unit's COPYs of
new rows chained inside its open transaction: `copy_in_transaction`).

psycopg2 runs one COPY per query, and a COPY costs two round trips: the query, answered
when the server is ready for rows, then the rows' end, answered when they are in. A
group of three tables, its checkpoint row and its COMMIT took seven. PostgreSQL's simple
query protocol takes several statements in one query, COPYs among them: the server asks
for each COPY's rows in turn, and runs the statements after the last COPY as soon as its
rows end. So a group is one query,

    BEGIN; COPY a FROM STDIN; COPY b FROM STDIN; COPY c FROM STDIN; <checkpoint row>; COMMIT

and four round trips: the query, then each COPY's end, the last one answered once the
group has committed. The lane sends the last COPY's rows, waits for the group before it
to commit, and only then ends that COPY (or fails it, which rolls the group back): the
commit order of parallel.py is kept. Measured on the 2-CPU machine of
docs/benchmarks/replicat.md: insert-heavy replicat from about 60% of a plain COPY to 65%.

libpq can do this; psycopg2 does not expose it. This module calls the libpq that
psycopg2 itself has loaded, through ctypes, on the connection psycopg2 opened
(`connection.pgconn_ptr`), and leaves it as psycopg2 expects it: every result read, the
transaction ended or rolled back. Errors are raised as psycopg2 would raise them (the
class of their SQLSTATE), so the run handles them as before. Where that libpq cannot be
found in the process (not Linux), `available()` is False and the lanes use psycopg2's
own calls.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg2
import psycopg2.errors
import psycopg2.extensions

from trailbound.crash import crashpoint

# libpq's ExecStatusType values used here, and the SQLSTATE field of PQresultErrorField.
_COPY_IN, _FATAL_ERROR = 4, 7
_SQLSTATE = ord("C")
_PIECE = 64 << 20  # bytes per PQputCopyData call (its length is a C int)

_lock = threading.Lock()
_libpq: ctypes.CDLL | None = None
_looked = False


def available() -> bool:
    return _library() is not None


def _library() -> ctypes.CDLL | None:
    """The libpq psycopg2 is linked against (its own copy, for psycopg2-binary), found
    among the files mapped into this process: another libpq's structures may differ."""
    global _libpq, _looked
    with _lock:
        if not _looked:
            _looked = True
            _libpq = _load()
        return _libpq


def _load() -> ctypes.CDLL | None:
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    mapped = {parts[5] for parts in (line.split(None, 5) for line in maps) if len(parts) == 6}
    paths = [path for path in mapped if Path(path).name.startswith("libpq") and ".so" in Path(path).name]
    if len(paths) != 1:
        return None
    lib = ctypes.CDLL(paths[0])  # already loaded: the same handle; calls release the GIL
    pointer, text, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for name, arguments, result in (("PQsendQuery", [pointer, text], size), ("PQgetResult", [pointer], pointer),
                                    ("PQresultStatus", [pointer], size), ("PQclear", [pointer], None),
                                    ("PQputCopyData", [pointer, pointer, size], size),
                                    ("PQputCopyEnd", [pointer, text], size),
                                    ("PQresultErrorField", [pointer, size], text),
                                    ("PQresultErrorMessage", [pointer], text), ("PQerrorMessage", [pointer], text)):
        function = getattr(lib, name)
        function.argtypes, function.restype = arguments, result
    return lib


def apply(connection, copies: list[tuple[str, memoryview]], tail: bytes, ready_to_commit: Callable[[], bool]) -> bool:
    """One target transaction on `connection` (in autocommit, idle): each (COPY
    statement, its rows) of `copies`, then `tail` (statements ending with COMMIT).
    `ready_to_commit` is called once every row has been sent and before the tail runs;
    False rolls the transaction back. Returns whether it committed; raises the server's
    error (after rolling back) as psycopg2 would."""
    query = _Query(_library(), connection)
    try:
        if not copies and not ready_to_commit():
            return False
        agreed = not copies  # whether ready_to_commit said yes before the tail could run
        query.send(b"BEGIN; " + "".join(f"{statement}; " for statement, _ in copies).encode() + tail)
        for number, (_, rows) in enumerate(copies):
            if not query.next_copy():
                break  # the server refused an earlier statement: finish() raises its error
            sent = query.copy_data(rows)
            if number == 0:
                crashpoint("mid_copy")
            if number == len(copies) - 1 and sent:
                if not ready_to_commit():
                    query.fail_copy("the group before this one did not commit")
                    query.finish(raise_error=False)
                    rollback_quietly(connection)
                    return False
                agreed = True
            query.end_copy()
        query.finish()  # raises the server's first error
        if not agreed:  # never expected: the server ended the query early without an error
            raise psycopg2.OperationalError("the target ended the group's query before its last COPY")
        return True
    except BaseException:
        query.finish(raise_error=False)  # whatever is left of the query, read or abandoned
        rollback_quietly(connection)
        raise


def copy_in_transaction(connection, copies: list[tuple[str, memoryview]]) -> None:
    """Each (COPY statement, its rows) of `copies`, chained in one query, inside the
    transaction psycopg2 has open on `connection` (psycopg2 must have begun it, so that
    its commit and rollback end it). Raises the server's first error as psycopg2 would;
    the transaction is then failed, for the caller to roll back."""
    query = _Query(_library(), connection)
    try:
        query.send("".join(f"{statement}; " for statement, _ in copies).encode())
        for number, (_, rows) in enumerate(copies):
            if not query.next_copy():
                break  # the server refused an earlier COPY: finish() raises its error
            query.copy_data(rows)
            if number == 0:
                crashpoint("mid_copy")
            query.end_copy()
        query.finish()
    except BaseException:
        query.finish(raise_error=False)  # whatever is left of the query, read or abandoned
        raise


class _Query:
    """One simple query in flight on a connection, read result by result."""

    def __init__(self, pq: ctypes.CDLL, connection):
        self.pq, self.conn = pq, ctypes.c_void_p(connection.pgconn_ptr)
        self.error: psycopg2.Error | None = None  # the server's first error

    def send(self, query: bytes) -> None:
        if not self.pq.PQsendQuery(self.conn, query):
            raise psycopg2.OperationalError(_text(self.pq.PQerrorMessage(self.conn)))

    def next_copy(self) -> bool:
        """Read results up to the server's request for the next COPY's rows (True), or
        up to an error (False: kept for finish)."""
        while result := self.pq.PQgetResult(self.conn):
            status = self.pq.PQresultStatus(result)
            if status == _FATAL_ERROR:
                self.error = self.error or _error(self.pq, result)
            self.pq.PQclear(result)
            if status in (_FATAL_ERROR, _COPY_IN):
                return status == _COPY_IN
        return False

    def copy_data(self, rows: memoryview) -> bool:
        """Send the rows from their own memory (no copy), in pieces that fit libpq's int.
        False if the server has ended the COPY already (an error: finish says which)."""
        data = np.frombuffer(rows, dtype=np.uint8)
        address = data.ctypes.data
        for at in range(0, len(data), _PIECE):
            if self.pq.PQputCopyData(self.conn, address + at, min(_PIECE, len(data) - at)) != 1:
                return False
        return True

    def end_copy(self) -> None:
        self.pq.PQputCopyEnd(self.conn, None)  # fails only if the COPY has ended already: finish says why

    def fail_copy(self, reason: str) -> None:
        self.pq.PQputCopyEnd(self.conn, reason.encode())

    def finish(self, raise_error: bool = True) -> None:
        """Read every result left (a COPY still open is failed); raise the first error."""
        while result := self.pq.PQgetResult(self.conn):
            status = self.pq.PQresultStatus(result)
            if status == _FATAL_ERROR:
                self.error = self.error or _error(self.pq, result)
            self.pq.PQclear(result)
            if status == _COPY_IN:  # the run stopped mid-COPY: end it so the query can finish
                self.fail_copy("abandoned")
        if self.error is not None and raise_error:
            raise self.error


def _error(pq, result) -> psycopg2.Error:
    """The server's error as psycopg2 raises it: the class of its SQLSTATE."""
    code = pq.PQresultErrorField(result, _SQLSTATE)
    message = _text(pq.PQresultErrorMessage(result))
    if not code:  # libpq's own (a lost connection)
        return psycopg2.OperationalError(message)
    try:
        return psycopg2.errors.lookup(code.decode())(message)
    except KeyError:
        return psycopg2.DatabaseError(message)


def _text(message: bytes | None) -> str:
    return (message or b"").decode("utf-8", "replace").strip()


def rollback_quietly(connection) -> None:
    """End the session's open transaction, if any. (A session in autocommit, as the
    parallel ones are: the driver's rollback() would send nothing.)"""
    try:
        idle = psycopg2.extensions.TRANSACTION_STATUS_IDLE
        if not connection.closed and connection.info.transaction_status != idle:
            with connection.cursor() as cur:
                cur.execute("ROLLBACK")
    except psycopg2.Error:
        pass
