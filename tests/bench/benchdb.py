"""A fresh database for a benchmark run, on the server the benchmarks are pointed at."""

from __future__ import annotations

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
