"""Replicat benchmark: apply rate for insert-heavy and update-heavy work, beside a plain
COPY of the same number of rows into the same tables, in one run.

    make bench                                   # all benchmarks
    .venv/bin/python tests/bench/bench_replicat.py [--rows N] [--grouptransops G ...]

Needs TRAILBOUND_METADATA_DSN and TRAILBOUND_TARGET_DSN (make bench provides its throwaway
server); uses databases `trailbound_bench_replicat_meta` and `..._target` on those servers,
dropped and created afresh. The trails are generated directly (a capture run would
dominate the time): OLTP-shaped transactions of 1 to 9 row changes on the simulated
source's shop.orders, shop.order_lines and shop.customers (numeric, timestamptz, arrays,
jsonb, text with awkward characters), written with trail.TrailWriter and committed in
trailbound.trail_file as capture would. Results go to docs/benchmarks/replicat.md.

- insert-heavy: every change an INSERT.
- update-heavy: the tables are first loaded (untimed) with the rows the updates touch;
  then 80% UPDATE (after images carrying the key and one or two changed columns, many
  keys updated several times), 10% INSERT, 10% DELETE.
- key-change-heavy: as update-heavy, but a quarter of the UPDATEs move their row to a new
  key (netted in Python, replicat/net/python.py, or by Spark past --key-change-limit
  records of them in a chunk).
- plain COPY: the same number of rows COPY'd (text format, from the driver) into empty
  copies of the same tables, with their primary keys, in one transaction per table; the
  median of three such COPYs.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from benchdb import cpu_seconds, fresh_database
from results import write_report

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "replicat.md"
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
TABLES = ("shop.customers", "shop.orders", "shop.order_lines")
TEXTS = ["O'Brien's \"quoted\" note", "tab\there", "back\\slash", "Zoë Ångström", "北京市朝阳区", "", None,
         "emoji 🚀", "plain"]


class Rows:
    """Rows of the three tables, in the contract's value encoding."""

    def __init__(self, seed: int):
        self.random = random.Random(seed)
        self.next_id = {t: 1 for t in TABLES}

    def ts(self, n: int) -> str:
        moment = T0 + timedelta(microseconds=n * 1237)
        return moment.strftime("%Y-%m-%d %H:%M:%S.%f") + "+00"

    def new(self, table: str) -> dict:
        r, n = self.random, self.next_id[table]
        self.next_id[table] += 1
        if table == "shop.customers":
            return {"id": n, "name": f"Name {n}", "email": f"user{n}@example.com", "country": r.choice(["DE", "JP", ""]),
                    "created_at": self.ts(n), "vip": r.random() < 0.1, "notes": r.choice(TEXTS)}
        if table == "shop.orders":
            return {"id": n, "customer_id": r.randrange(1, 10_000), "status": "new",
                    "total": f"{r.randrange(100, 10**7) / 100:.2f}", "ordered_at": self.ts(n),
                    "ship_date": None, "items": r.choice(["{1,2}", "{}", "{7,NULL}"]),
                    "meta": r.choice(['{"channel": "web"}', None, '{"n": 1.5, "tags": ["a"]}'])}
        return {"order_id": n, "line_no": 1, "sku": f"SKU-{r.randrange(5000):05d}", "qty": r.randrange(1, 9),
                "price": f"{r.randrange(100, 10**6) / 100:.2f}", "discount": r.choice([None, 0.05, 0.125])}

    def key(self, table: str, row: dict) -> dict:
        return {"order_id": row["order_id"], "line_no": row["line_no"]} if table == "shop.order_lines" \
            else {"id": row["id"]}

    def change(self, table: str, key: dict) -> dict:
        r = self.random
        if table == "shop.customers":
            return key | {"notes": r.choice(TEXTS)} | ({"vip": True} if r.random() < 0.3 else {})
        if table == "shop.orders":
            return key | {"status": r.choice(["paid", "packed", "shipped"])} | \
                ({"ship_date": "2026-11-03"} if r.random() < 0.5 else {})
        return key | {"qty": r.randrange(1, 9)}


def generate(kind: str, rows: int, seed: int = 7) -> tuple[list[list[tuple]], dict[str, list[dict]]]:
    """Transactions of (op, table, before, after) and, for update-heavy work, the rows the
    target must hold first."""
    gen = Rows(seed)
    preload: dict[str, list[dict]] = {t: [] for t in TABLES}
    live: dict[str, list[dict]] = {t: [] for t in TABLES}
    if kind in ("update", "keychange"):
        for table in TABLES:
            for _ in range(rows // 6):
                row = gen.new(table)
                preload[table].append(row)
                live[table].append(gen.key(table, row))
    transactions, made = [], 0
    while made < rows:
        txn = []
        for _ in range(min(gen.random.randrange(1, 10), rows - made)):
            table = gen.random.choice(TABLES)
            roll = gen.random.random()
            if kind == "insert" or roll < 0.1 or not live[table]:
                row = gen.new(table)
                live[table].append(gen.key(table, row))
                txn.append(("INSERT", table, None, row))
            elif roll < 0.2 and len(live[table]) > 1:
                key = live[table].pop(gen.random.randrange(len(live[table])))
                txn.append(("DELETE", table, key, None))
            else:  # recently touched keys are likelier: some keys change several times per group
                pool = live[table]
                at = len(pool) - 1 - min(len(pool) - 1, int(gen.random.expovariate(1 / 2000)))
                key = pool[at]
                after = gen.change(table, key)
                if kind == "keychange" and gen.random.random() < 0.25:  # the row moves to a new key
                    moved = gen.key(table, gen.new(table))
                    after |= moved
                    pool[at] = moved
                txn.append(("UPDATE", table, key, after))
        transactions.append(txn)
        made += len(txn)
    return transactions, preload


def write_trail(transactions, prefix: Path, trail_module, defs=None) -> list:
    """The transactions as trail files; with `defs`, the inserts carry their COPY lines
    (as capture writes them) where the engine under test has them (trail format 2)."""
    encode = lambda image: None if image is None else json.dumps(image, ensure_ascii=False,  # noqa: E731
                                                                  separators=(",", ":"))
    options = {}
    if defs is not None and hasattr(trail_module, "with_copy_lines"):
        from trailbound.copytext import layouts_of

        options["layouts"] = layouts_of(defs)
    from trailbound.positions import Scn

    # An engine from before log_bsn was an Scn takes a bare int.
    log_bsn = 1 if trail_module.TrailFileInfo.__annotations__.get("log_bsn") == "int" else Scn(1)
    writer = trail_module.TrailWriter(prefix, 1, max_bytes=128 * 1024 * 1024, group="BENCH", log_bsn=log_bsn,
                                      **options)
    names = [name for name in trail_module.COLUMNS if name != "copy_line"]
    schema = pa.schema([trail_module.SCHEMA.field(name) for name in names])
    columns = {name: [] for name in names}
    for number, txn in enumerate(transactions, start=1):
        for index, (op, table, before, after) in enumerate(txn):
            ind = 3 if len(txn) == 1 else 0 if index == 0 else 2 if index == len(txn) - 1 else 1
            values = {"rba": 0, "trans_ind": ind, "csn": number * 10, "csn_thread": 1, "csn_sequence": 1,
                      "csn_rba": number, "xid": f"X{number}", "commit_ts": T0 + timedelta(milliseconds=number),
                      "op": op, "table": table, "before": encode(before), "after": encode(after),
                      "src_thread": 1, "src_sequence": 1, "src_rba": number, "src_scn": number * 10 - 1,
                      "log_bsn": 1}
            for name, value in values.items():
                columns[name].append(value)
        if len(columns["rba"]) >= 200_000:
            writer.add(pa.RecordBatch.from_pydict(columns, schema=schema))
            columns = {name: [] for name in names}
    if columns["rba"]:
        writer.add(pa.RecordBatch.from_pydict(columns, schema=schema))
    return writer.close()


def copy_text(rows: list[dict], columns: list[str]) -> bytes:
    from trailbound.replicat.apply.serial import _text
    from trailbound.replicat.net import copy_escape

    return "".join("\t".join(copy_escape(_text(row[c])) for c in columns) + "\n" for row in rows).encode()


def plain_copy(target_dsn: str, defs, transactions, schema: str) -> tuple[float, int]:
    """COPY as many rows as the work has row changes into empty copies of its tables."""
    from trailbound.replicat import target as tgt

    rules = [configuration_rule(schema)]
    per_table: dict[str, list[dict]] = {t: [] for t in TABLES}
    gen = Rows(99)
    for txn in transactions:
        for op, table, before, after in txn:
            per_table[table].append(gen.new(table))
    payloads = {t: copy_text(rows, [c.name for c in defs[t].columns]) for t, rows in per_table.items()}
    connection = psycopg2.connect(target_dsn)
    with connection.cursor() as cur:
        tgt.create_tables(cur, {t: defs[t] for t in TABLES}, rules)
    connection.commit()
    started = time.perf_counter()
    with connection.cursor() as cur:
        for table, payload in payloads.items():
            name = table.split(".", 1)[1]
            cur.copy_expert(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(schema, name)).as_string(cur),
                            io.BytesIO(payload), size=1 << 20)
            connection.commit()
    seconds = time.perf_counter() - started
    connection.close()
    return seconds, sum(len(r) for r in per_table.values())


def no_spark():
    """What a benchmark gives run_replicat for Spark when the work must not need it."""
    raise AssertionError("insert-heavy work needs no Spark")


def median_copy(target_server: str, defs, transactions) -> tuple[tuple[float, int], list[tuple[float, int]]]:
    """plain_copy three times, each into a fresh database: the median (seconds, rows),
    and all three. One COPY's time varies by a tenth from run to run, and a share of
    COPY is only as steady as its denominator."""
    copies = sorted(plain_copy(fresh_database(target_server, "trailbound_bench_replicat_copy"), defs, transactions,
                               "shop") for _ in range(3))
    return copies[1], copies


def insert_workspace(rows: int, prefix: str, sessions: int = 2):
    """A temporary home holding the simulated source's table definitions, an insert-heavy
    trail of `rows` changes (dirdat/lt) and REP1's configuration at GROUPTRANSOPS 1000:
    (home, defs, transactions, trail files, configuration). The caller removes it."""
    import tempfile

    from trailbound.archive.segments import load_defs
    from trailbound.archive.writer import write_defs
    from trailbound.sources.simulator import source_tables
    from trailbound.trail import format as trail

    work = Path(tempfile.mkdtemp(prefix=prefix))
    write_defs(work / "archive", [t.definition() for t in source_tables()])
    defs = load_defs(work / "archive")
    transactions, _ = generate("insert", rows)
    files = write_trail(transactions, work / "dirdat" / "lt", trail, defs)
    return work, defs, transactions, files, replicat_config(work, work / "archive", 1000, sessions)


def configuration_rule(schema: str):
    from trailbound.config import MapRule

    return MapRule(source="shop.*", target=f"{schema}.*")


def replicat_config(home: Path, archive: Path, grouptransops: int, sessions: int):
    """REP1 reading `home`/dirdat/lt into the three tables: the configuration, loaded."""
    from trailbound import config as configuration

    path = home / "trailbound.yaml"
    path.write_text(f"home: {home}\nsources:\n  BENCH:\n    altarchivelogdest: {archive}\nreplicats:\n  REP1:\n"
                    f"    exttrail: dirdat/lt\n    source: BENCH\n    grouptransops: {grouptransops}\n"
                    f"    apply_parallelism: {sessions}\n    map:\n" +
                    "".join(f"      - {{source: {t}, target: {t}}}\n" for t in TABLES))
    return configuration.load(path)


def create_target(target_dsn: str, defs) -> None:
    """The three tables, empty, in the target."""
    from trailbound.replicat import target as tgt

    with psycopg2.connect(target_dsn) as connection, connection.cursor() as cur:
        tgt.create_tables(cur, {t: defs[t] for t in TABLES}, [configuration_rule("shop")])
    connection.close()


def register_trail(store, prefix: Path, files) -> None:
    """The trail's files, committed in trailbound.trail_file as capture would."""
    with store.transaction() as cur:
        for f in files:
            cur.execute("INSERT INTO trailbound.trail_file (trail, seqno, path, records, bytes, sha256, first_csn,"
                        " last_csn, log_bsn, written_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'BENCH')",
                        (str(prefix), f.seqno, str(f.path), f.records, f.bytes, f.sha256, str(f.first_csn),
                         str(f.last_csn), getattr(f.log_bsn, "value", f.log_bsn)))


def preload_target(target_dsn: str, defs, preload: dict[str, list[dict]]) -> None:
    connection = psycopg2.connect(target_dsn)
    with connection.cursor() as cur:
        for table, rows in preload.items():
            if rows:
                cur.copy_expert(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(*table.split(".", 1)))
                                .as_string(cur), io.BytesIO(copy_text(rows, [c.name for c in defs[table].columns])))
        cur.execute("ANALYZE")
    connection.commit()
    connection.close()


def target_digest(target_dsn: str) -> str:
    """One MD5 over every replicated table's rows in key order: equal digests, equal replicas."""
    connection = psycopg2.connect(target_dsn)
    with connection.cursor() as cur:
        parts = []
        for table in TABLES:
            cur.execute(sql.SQL("SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} t")
                        .format(sql.Identifier(*table.split(".", 1))))
            parts.append(cur.fetchone()[0])
    connection.close()
    return hashlib.md5("".join(parts).encode()).hexdigest()


def warm_up(spark, work: Path, defs) -> None:
    """One small net change through Spark first: the JVM compiles its code on first use,
    which would otherwise land on whichever contender runs first."""
    from trailbound.replicat.net import Shape
    from trailbound.replicat.net.spark import copy_lines, net_changes

    transactions, _ = generate("update", 20_000, seed=1)
    rows = [(n, s, table, op, json.dumps(before) if before else None, json.dumps(after) if after else None)
            for n, txn in enumerate(transactions) for s, (op, table, before, after) in enumerate(txn)]
    frame = spark.createDataFrame(rows, "unit long, seq long, table string, op string, before string, after string")
    shapes = {t: Shape.of([c.name for c in defs[t].columns], defs[t].key) for t in TABLES}
    for _ in range(2):
        copy_lines(net_changes(frame, shapes), shapes).write.mode("overwrite").format("noop").save()


def wait_for_quiet_jvms(most: float = 20.0) -> float:
    """Wait until the JVMs on this machine (Spark's driver, a standalone cluster's) use
    under 5% of a CPU over a quarter of a second, at most `most` seconds; returns the
    seconds waited. The warm-up's JIT compiles and collections go on after it returns:
    measured, the JVM used 0.65 CPU-s during a run that followed the warm-up at once
    (44.6% of COPY) and 0.00-0.01 CPU-s during the next ones (62-66%)."""
    def jvm_seconds() -> float:
        used = 0.0
        for comm in Path("/proc").glob("[0-9]*/comm"):
            try:
                if comm.read_text().strip() == "java":
                    used += cpu_seconds(comm.parent.name)
            except OSError:  # a process that has just ended
                continue
        return used

    began = time.perf_counter()
    used = jvm_seconds()
    while time.perf_counter() - began < most:
        time.sleep(0.25)
        now = jvm_seconds()
        if now - used < 0.05 * 0.25:
            break
        used = now
    return time.perf_counter() - began


class StandaloneCluster:
    """A Spark standalone master and one worker on 127.0.0.1, from the pyspark install."""

    def __init__(self, work: Path, cores: int = 2):
        import pyspark

        home = Path(pyspark.__file__).parent
        spark_class = str(home / "bin" / "spark-class")
        self.port = _free_port()
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
               "SPARK_DAEMON_MEMORY": "256m"}
        work.mkdir(parents=True, exist_ok=True)
        self.processes = [subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
             "--webui-port", str(_free_port())], env=env, stdout=open(work / "master.log", "w"),
            stderr=subprocess.STDOUT)]
        self.processes.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
             "--memory", "2g", "--work-dir", str(work / "worker"), "--webui-port", str(_free_port()), self.master],
            env=env, stdout=open(work / "worker.log", "w"), stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while "Successfully registered with master" not in (work / "worker.log").read_text():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"the standalone cluster did not start: see {work}")
            time.sleep(0.5)

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            process.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="row changes per workload")
    parser.add_argument("--grouptransops", type=int, nargs="+", default=[1000, 50_000])
    parser.add_argument("--work", nargs="+", default=["insert", "update"], choices=["insert", "update", "keychange"])
    parser.add_argument("--key-change-limit", type=int, default=None,
                        help="records of key-changing (unit, table)s per chunk netted in Python (net.python.LIMIT; "
                             "more go to Spark); default: the engine's")
    parser.add_argument("--apply-parallelism", type=int, nargs="+", default=[2],
                        help="replicat's apply_parallelism (sessions applying insert-only groups at once)")
    parser.add_argument("--masters", nargs="+", default=["local[*]"],
                        help="Spark masters to run under: local[N], local[*], or 'standalone' (a master and one "
                             "worker on 127.0.0.1, started here)")
    parser.add_argument("--no-copy-lines", action="store_true",
                        help="a trail whose inserts carry no COPY lines (as format 1, or a table capture had no "
                             "definition for): replicat parses every image")
    parser.add_argument("--no-write", action="store_true", help=f"print only; leave {RESULTS.name} alone")
    args = parser.parse_args()

    from trailbound import spark as spark_session
    from trailbound.trail import format as trail
    from trailbound.archive.segments import load_defs
    from trailbound.archive.writer import write_defs
    from trailbound.metadata import MetadataStore, dsn_from_env
    from trailbound.replicat.net import python as netpython
    from trailbound.replicat.run import run_replicat
    from trailbound.sources.simulator import source_tables

    if args.key_change_limit is not None:
        netpython.LIMIT = args.key_change_limit

    work = REPO / "var" / "bench" / f"replicat-{args.rows}"
    shutil.rmtree(work, ignore_errors=True)
    write_defs(work / "archive", [t.definition() for t in source_tables()])
    defs = load_defs(work / "archive")
    metadata_server = dsn_from_env("TRAILBOUND_METADATA_DSN")
    target_server = dsn_from_env("TRAILBOUND_TARGET_DSN")
    results, timings, digests = [], {}, {}
    load_before = os.getloadavg()[0]
    workloads = {}
    for kind in args.work:
        transactions, preload = generate(kind, args.rows)
        prefix = work / kind / "dirdat" / "lt"
        files = write_trail(transactions, prefix, trail, None if args.no_copy_lines else defs)
        (copy_seconds, copied), _ = median_copy(target_server, defs, transactions)
        workloads[kind] = (transactions, preload, prefix, files, copy_seconds, copied)
    for master in args.masters:
        cluster = StandaloneCluster(work / "cluster") if master == "standalone" else None
        spark = spark_session.session("trailbound-bench", master=cluster.master if cluster else master)
        warm_up(spark, work, defs)
        print(f"{master}: waited {wait_for_quiet_jvms():.1f} s for the JVMs to go quiet after the warm-up", flush=True)
        for kind in args.work:
            transactions, preload, prefix, files, copy_seconds, copied = workloads[kind]
            for groupops, sessions in ((g, p) for g in args.grouptransops for p in args.apply_parallelism):
                meta_dsn = fresh_database(metadata_server, "trailbound_bench_replicat_meta")
                target_dsn = fresh_database(target_server, "trailbound_bench_replicat_target")
                config = replicat_config(work / kind, work / "archive", groupops, sessions)
                create_target(target_dsn, defs)
                preload_target(target_dsn, defs, preload)
                store = MetadataStore.open(meta_dsn)
                register_trail(store, prefix, files)
                started = time.perf_counter()
                result = run_replicat(spark, store, config, "REP1", target_dsn=target_dsn)
                seconds = time.perf_counter() - started
                store.close()
                assert result.operations == args.rows, result.describe()
                digest = target_digest(target_dsn)
                digests.setdefault((kind, groupops), set()).add(digest)
                results.append((master, kind, groupops, sessions, len(transactions), result, seconds, copy_seconds,
                                copied, digest))
                timings[(master, kind, groupops, sessions)] = result.timings
                print(f"{master} {kind}-heavy, grouptransops {groupops}, {sessions} session(s): "
                      f"{args.rows / seconds:,.0f} changes/s "
                      f"({seconds:.1f} s); plain COPY {copied / copy_seconds:,.0f} rows/s ({copy_seconds:.1f} s); "
                      f"target digest {digest}\n  {result.describe()}\n  "
                      f"{ {k: round(v, 1) for k, v in result.timings.items()} }", flush=True)
        spark.stop()
        if cluster:
            cluster.stop()
    for kind in args.work:
        shutil.rmtree(work / kind / "dirdat", ignore_errors=True)
    assert all(len(found) == 1 for found in digests.values()), f"replicas differ between masters: {digests}"

    command = (f".venv/bin/python tests/bench/bench_replicat.py --rows {args.rows} --grouptransops "
               f"{' '.join(str(g) for g in args.grouptransops)} --work {' '.join(args.work)} --masters "
               f"{' '.join(args.masters)} --apply-parallelism {' '.join(str(p) for p in args.apply_parallelism)}")
    lines = []
    for master, kind, groupops, sessions, txns, result, seconds, copy_seconds, copied, digest in results:
        rate, copy_rate = args.rows / seconds, copied / copy_seconds
        lines.append(f"| {master} | {kind}-heavy | {groupops:,} | {sessions} | {txns:,} | {result.groups:,} | "
                     f"{seconds:.2f} s | "
                     f"**{rate:,.0f}** | {copy_rate:,.0f} | **{rate / copy_rate:.0%}** | `{digest[:12]}` |")
    phases = sorted({p for t in timings.values() for p in t})
    header = " | ".join(f"{m}, {k}-heavy, {g:,}, {p} session(s)" for m, k, g, p in timings)
    breakdown = "\n".join(f"| {p} | " + " | ".join(f"{timings[key].get(p, 0):.1f} s" for key in timings) + " |"
                          for p in phases)
    speedups = []
    for kind in args.work:
        for groupops in args.grouptransops:
            seconds = {m: sec for m, k, g, p, _, _, sec, _, _, _ in results
                       if (k, g, p) == (kind, groupops, args.apply_parallelism[0])}
            if "local[1]" in seconds and "local[2]" in seconds:
                speedups.append(f"{kind}-heavy at {groupops:,}: local[2] is {seconds['local[1]'] / seconds['local[2]']:.2f}x "
                                "local[1]")
    # The run loads the CPUs itself; only past twice their number were other jobs surely running.
    load_after = os.getloadavg()[0]
    shared = max(load_before, load_after) > 2 * (os.cpu_count() or 1)
    loads = f"load average {load_before:.1f} before, {load_after:.1f} after"
    conditions = (f"**The machine was shared with other work** ({loads}): times are inflated and noisy."
                  if shared else f"Nothing else ran on the machine ({loads}).")
    report = f"""# Replicat benchmark

Apply rate of one replicat run (`run_replicat`: trail read and verified, net change,
COPY and merge into PostgreSQL, checkpoint table row and file checkpoint per group) over
generated trails of {args.rows:,} row changes, beside a plain COPY of the same number of
rows into the same tables (the median of three). Transactions hold 1 to 9 changes over shop.customers,
shop.orders and shop.order_lines (numeric, timestamptz, arrays, jsonb, awkward text);
update-heavy work is 80% UPDATE (partial after images; recently touched keys are
likelier, so keys repeat within a group), 10% INSERT, 10% DELETE, on tables preloaded
with the rows it touches. The digest is an MD5 over the target tables' rows: the same
digest, the same replica.

Command, from the repository root (`make bench` runs it with the throwaway PostgreSQL):

    {command}

| Spark master | work | grouptransops | apply_parallelism | source transactions | target transactions | replicat | changes/s | plain COPY rows/s | share of COPY | target digest |
|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(lines)}

{"; ".join(speedups) + "." if speedups else ""}
Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {platform.platform()},
Python {platform.python_version()}; PostgreSQL (fsync off) and Spark on the same machine.
{conditions}

Where the time goes (seconds; "prepare" runs in a background thread up to two chunks ahead
of "apply", so the phases overlap and add up to more than the wall time):

| phase | {header} |
|---|{"---|" * len(timings)}
{breakdown}
"""
    print(report)
    if not args.no_write:
        write_report(RESULTS, report + READING)
    return 0


READING = """
Reading the figures: docs/replicat.md ("Performance") says what each phase is; the
before/after comparison of 2026-11-23 in this file was written by hand from runs with
--no-write (see its commands).
"""


if __name__ == "__main__":
    sys.exit(main())
