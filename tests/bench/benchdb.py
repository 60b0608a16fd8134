"""A fresh database for a benchmark run, on the server the benchmarks are pointed at, and
the CPU a session's server process uses."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg2
import psycopg2.extensions
from psycopg2 import sql


def fresh_database(server_dsn: str, name: str) -> str:
    """Drop and create database `name` on the server of `server_dsn`; its DSN."""
    admin = psycopg2.connect(psycopg2.extensions.make_dsn(server_dsn, dbname="postgres"))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    admin.close()
    return psycopg2.extensions.make_dsn(server_dsn, dbname=name)


def backend_cpu(connection):
    """A function giving the CPU seconds the connection's server process has used since
    now, or None when that process is not on this machine."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    connection.commit()
    try:
        if not Path(f"/proc/{pid}/comm").read_text().startswith("postgres"):
            return None
        start = cpu_seconds(pid)
    except OSError:
        return None
    return lambda: cpu_seconds(pid) - start


def cpu_seconds(pid: int | str) -> float:
    """The CPU seconds a process on this machine has used (utime + stime, /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
