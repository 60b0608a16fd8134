"""The suite's own PostgreSQL servers (trailbound.devtools.localpg): they start even when
the port found free is taken before the server binds it, as happens when two test
workers start servers at once or a client socket gets that port."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psycopg2
import pytest

from trailbound.devtools import localpg
from trailbound.devtools.localpg import LocalServer

pytestmark = [pytest.mark.pg]

REPO = Path(__file__).resolve().parent.parent


def test_a_server_whose_port_is_taken_before_it_binds_starts_on_another(monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    server = LocalServer(REPO / "var" / "test-pg-port" / str(os.getpid()), databases=())
    try:
        server.directory.mkdir(parents=True, exist_ok=True)
        server.port_file.write_text(str(taken.getsockname()[1]))
        # The probe says free, as it did a moment before the port was taken.
        monkeypatch.setattr(localpg, "_port_is_free", lambda port: True)
        server.start()
        assert server.port != taken.getsockname()[1]
        assert b"Address already in use" in server.log_file.read_bytes(), "the first try met the taken port"
        with psycopg2.connect(server.dsn()) as connection, connection.cursor() as cur:
            cur.execute("SELECT current_setting('port')::int")
            assert cur.fetchone()[0] == server.port
        connection.close()
    finally:
        taken.close()
        server.remove()
