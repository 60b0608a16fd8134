"""A throwaway local PostgreSQL server for the demo and the test suite.

    python -m trailbound.devtools.localpg start DIR   # initdb on first use, start, print the DSNs
    python -m trailbound.devtools.localpg env DIR     # print TRAILBOUND_*_DSN=... lines for the shell
    python -m trailbound.devtools.localpg stop DIR

The cluster lives in DIR (an ignored folder of the repo), listens on 127.0.0.1 only, on a
free port chosen at first start and kept in DIR/port, and trusts local connections:
it is a scratch server, never a production one. Durability is switched off for speed
(fsync, synchronous_commit); trailbound's own crash safety is tested by killing
trailbound, not the server. initdb refuses to run as root, so as root the server runs
as the `postgres` user.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from psycopg2 import sql

SUPERUSER = "trailbound"
DATABASES = ("trailbound_meta", "trailbound_target")
_SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off "
    "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
)


def accepts(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (a server that is up)."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (another process may take it
    before the caller binds it: callers retry)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass(frozen=True)
class LocalServer:
    directory: Path
    # More server options, e.g. "-c wal_level=logical" for a source that a log miner reads
    # through logical decoding (tests/pg_source_kit.py); used when the server starts.
    options: str = ""
    # The databases start() creates when missing.
    databases: tuple[str, ...] = DATABASES

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def port_file(self) -> Path:
        return self.directory / "port"

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    @property
    def port(self) -> int:
        return int(self.port_file.read_text())

    def dsn(self, database: str = "postgres") -> str:
        # URI form: no spaces, so `env $(python -m trailbound.devtools.localpg env DIR) cmd` works.
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a PostgreSQL server binary, as `postgres` when we are root."""
        argv = list(command)
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=check, capture_output=True, text=True)

    def is_running(self) -> bool:
        if not (self.data / "PG_VERSION").exists():
            return False
        return self._run("pg_ctl", "status", "-D", str(self.data), check=False).returncode == 0

    def start(self) -> "LocalServer":
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and not self.is_running():
            # (A running server's files are its own already, and come and go as it works.)
            postgres = pwd.getpwnam("postgres")
            for path in [self.directory, *self.directory.rglob("*")]:
                try:
                    os.chown(path, postgres.pw_uid, postgres.pw_gid)
                except FileNotFoundError:
                    pass
        if not (self.data / "PG_VERSION").exists():
            if self.data.exists():
                shutil.rmtree(self.data)
            self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                      "--encoding=UTF8", "--no-locale", "--no-sync")
        if not self.is_running():
            self._start_on_a_free_port()
        self._wait_ready()
        self._create_databases()
        return self

    def _start_on_a_free_port(self, tries: int = 3) -> None:
        # A port found free may be taken before the server binds it (by another server
        # starting beside this one, or by a client socket's ephemeral port): then the
        # start fails with "Address already in use", and another port is tried.
        for attempt in range(tries):
            if attempt or not self.port_file.exists() or not _port_is_free(self.port):
                self.port_file.write_text(str(free_port()))
                if os.geteuid() == 0:
                    postgres = pwd.getpwnam("postgres")
                    os.chown(self.port_file, postgres.pw_uid, postgres.pw_gid)
            logged = self.log_file.stat().st_size if self.log_file.exists() else 0
            result = self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log_file),
                               "-o", f"-p {self.port} {_SERVER_OPTIONS} {self.options}".rstrip(), check=False)
            if result.returncode == 0:
                return
            with self.log_file.open("rb") as log:
                log.seek(logged)
                if b"Address already in use" not in log.read():
                    break
        raise RuntimeError(f"PostgreSQL did not start; see {self.log_file}\n{result.stderr}")

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg2.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _create_databases(self) -> None:
        connection = psycopg2.connect(self.dsn())
        connection.autocommit = True
        try:
            with connection.cursor() as cur:
                for database in self.databases:
                    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                    if cur.fetchone() is None:
                        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        finally:
            connection.close()

    def stop(self) -> None:
        if self.is_running():
            self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every session ends, the server is back on the same port."""
        self._run("pg_ctl", "restart", "-w", "-t", "60", "-m", "fast", "-D", str(self.data), "-l", str(self.log_file))

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def environment(self) -> dict[str, str]:
        return {
            "TRAILBOUND_METADATA_DSN": self.dsn("trailbound_meta"),
            "TRAILBOUND_TARGET_DSN": self.dsn("trailbound_target"),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trailbound.devtools.localpg", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "remove", "env", "status"])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    server = LocalServer(args.directory.resolve())
    if args.action == "start":
        server.start()
        print(f"PostgreSQL running on 127.0.0.1:{server.port} (data in {server.data}, log {server.log_file})")
    elif args.action == "stop":
        server.stop()
    elif args.action == "remove":
        server.remove()
    elif args.action == "status":
        running = server.is_running()
        print("running" if running else "stopped")
        return 0 if running else 1
    elif args.action == "env":
        for name, value in server.environment().items():
            print(f"{name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
