"""replicat/apply/copychain.py on a real server: a target transaction of several COPYs and a
tail in one query, as a parallel session sends a group. What the lanes rely on: the rows
and the tail commit together, or nothing does; a server error comes back as psycopg2's
class for its SQLSTATE; and the session is left ready for its next query either way."""

from __future__ import annotations

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest
from psycopg2 import sql

from trailbound.replicat.apply import copychain

pytestmark = pytest.mark.skipif(not copychain.available(), reason="psycopg2's libpq not found (not Linux)")


@pytest.fixture
def session(target_dsn):
    with psycopg2.connect(target_dsn) as setup, setup.cursor() as cur:
        cur.execute("CREATE TABLE a (id int PRIMARY KEY, note text); CREATE TABLE b (id int PRIMARY KEY);"
                    " CREATE TABLE mark (n int)")
    setup.close()
    connection = psycopg2.connect(target_dsn)
    connection.autocommit = True  # as a lane's
    yield connection
    connection.close()


def _copies(a: bytes, b: bytes) -> list[tuple[str, memoryview]]:
    return [("COPY a (id, note) FROM STDIN", memoryview(a)), ("COPY b (id) FROM STDIN", memoryview(b))]


def _rows(connection) -> tuple[list, list, list]:
    with connection.cursor() as cur:
        found = []
        for table in ("a", "b", "mark"):
            cur.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(table)))
            found.append(cur.fetchall())
    return tuple(found)


def test_the_copies_and_the_tail_commit_together_once_ready(session):
    asked = []
    committed = copychain.apply(session, _copies(b"1\tone\n2\ttwo\\ttabbed\n", b"7\n"),
                                b"INSERT INTO mark VALUES (1); COMMIT",
                                lambda: asked.append(_rows_elsewhere(session)) or True)
    assert committed
    # When asked, every row had been sent but nothing was visible to another session.
    assert asked == [([], [], [])]
    assert _rows(session) == ([(1, "one"), (2, "two\ttabbed")], [(7,)], [(1,)])


def _rows_elsewhere(session) -> tuple[list, list, list]:
    other = psycopg2.connect(session.dsn)
    try:
        return _rows(other)
    finally:
        other.close()


def test_a_group_not_ready_to_commit_leaves_nothing_and_the_session_usable(session):
    assert not copychain.apply(session, _copies(b"1\tone\n", b"7\n"), b"INSERT INTO mark VALUES (1); COMMIT",
                               lambda: False)
    assert _rows(session) == ([], [], [])
    assert copychain.apply(session, _copies(b"3\tthree\n", b"8\n"), b"COMMIT", lambda: True)
    assert _rows(session) == ([(3, "three")], [(8,)], [])


def test_a_refused_row_raises_its_psycopg2_class_and_commits_nothing(session):
    with session.cursor() as cur:
        cur.execute("INSERT INTO b VALUES (8)")
    asked = []
    with pytest.raises(psycopg2.errors.UniqueViolation, match='duplicate key value violates unique constraint "b_pkey"'):
        copychain.apply(session, _copies(b"1\tone\n", b"8\n"), b"INSERT INTO mark VALUES (1); COMMIT",
                        lambda: asked.append(True) or True)
    assert _rows(session) == ([], [(8,)], [])
    # An error in the first COPY stops the query there: the second's rows are never asked for.
    with pytest.raises(psycopg2.errors.InvalidTextRepresentation, match="invalid input syntax for type integer"):
        copychain.apply(session, _copies(b"x\tone\n", b"9\n"), b"COMMIT", lambda: asked.append(True) or True)
    assert asked == [True]
    assert session.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    assert _rows(session) == ([], [(8,)], [])
    assert copychain.apply(session, _copies(b"4\tfour\n", b"9\n"), b"COMMIT", lambda: True)
    assert _rows(session) == ([(4, "four")], [(8,), (9,)], [])
