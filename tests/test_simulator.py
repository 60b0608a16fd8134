"""The simulated source writes a contract-conformant redo archive with every hard case in it,
and a truth file that an independent replay of the raw archive reproduces exactly.

Fast tier: pure Python, no Spark, no database. Everything here reads the raw files with
pyarrow and json; nothing uses the simulator's internals.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trailbound.archive.contract import (
    DEFS_FILE,
    DML_OPS,
    MANIFEST_FIELDS,
    MANIFEST_OPTIONAL,
    OPS,
    RECORD_FIELDS,
    SEGMENT_RE,
)
from replay_kit import apply_change, canonical, row_identity
from trailbound.sources.simulator import simulate

# Small but complete: every scheduled story still happens (they are placed at fractions
# of the duration), and it takes a few seconds.
RECORDS = 20_000
HOURS = 30.0
SEGMENT_MINUTES = 15
START = datetime(2026, 11, 1, tzinfo=UTC)
PG_TYPES = {"bigint", "integer", "text", "numeric", "timestamptz", "date", "bytea", "jsonb",
            "boolean", "double precision", "integer[]", "text[]"}


# --------------------------------------------------------------------------------------
# Reading a raw archive (independently of the simulator)
# --------------------------------------------------------------------------------------

@dataclass
class Archive:
    path: Path
    defs: dict
    manifests: dict[tuple[int, int], dict] = field(default_factory=dict)
    # log order per thread, each with its thread, sequence and position in this list
    records: list[dict] = field(default_factory=list)

    def threads(self) -> list[int]:
        return sorted({thread for thread, _ in self.manifests})

    def thread_manifests(self, thread: int) -> list[dict]:
        return [self.manifests[key] for key in sorted(self.manifests) if key[0] == thread]

    def keys(self) -> dict[str, list[str]]:
        return {t["name"]: t["key"] for t in self.defs["tables"]}

    def columns(self) -> dict[str, list[str]]:
        return {t["name"]: [c["name"] for c in t["columns"]] for t in self.defs["tables"]}


def parse_time(text: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z", text), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def read_data_file(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    rows = []
    for line in path.read_text("utf-8").splitlines():
        row = json.loads(line)
        assert list(row) == list(RECORD_FIELDS)
        row["ts"] = parse_time(row["ts"])
        rows.append(row)
    return rows


def read_archive(path: Path) -> Archive:
    archive = Archive(path, json.loads((path / DEFS_FILE).read_text("utf-8")))
    for file in path.iterdir():
        match = SEGMENT_RE.match(file.name)
        if match and match["ext"] == "json":
            archive.manifests[int(match["thread"]), int(match["sequence"])] = json.loads(file.read_text("utf-8"))
    for (thread, sequence) in sorted(archive.manifests):
        manifest = archive.manifests[(thread, sequence)]
        data = path / f"arch_{thread}_{sequence:09d}.{manifest['format']}"
        for row in read_data_file(data):
            row["thread"], row["sequence"], row["position"] = thread, sequence, len(archive.records)
            archive.records.append(row)
    return archive


def file_digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


# --------------------------------------------------------------------------------------
# Transactions, assembled from the raw records
# --------------------------------------------------------------------------------------

@dataclass
class Transaction:
    xid: str
    records: list[dict] = field(default_factory=list)   # its own and its subtransactions'
    end: dict | None = None                              # the top-level COMMIT or ROLLBACK
    rolled_back_subs: set[str] = field(default_factory=set)

    @property
    def committed(self) -> bool:
        return self.end is not None and self.end["op"] == "COMMIT"

    @property
    def rolled_back(self) -> bool:
        return self.end is not None and self.end["op"] == "ROLLBACK"

    def surviving_changes(self) -> list[dict]:
        changes = [r for r in self.records if r["op"] in DML_OPS and r["xid"] not in self.rolled_back_subs]
        return sorted(changes, key=lambda r: (r["scn"], r["sequence"], r["rba"]))


def transactions(archive: Archive) -> dict[str, Transaction]:
    result: dict[str, Transaction] = {}
    for record in archive.records:
        top = record["parent_xid"] or record["xid"]
        txn = result.setdefault(top, Transaction(top))
        txn.records.append(record)
        if record["op"] == "ROLLBACK" and record["parent_xid"] is not None:
            txn.rolled_back_subs.add(record["xid"])
        elif record["op"] in ("COMMIT", "ROLLBACK"):
            txn.end = record
    return result


# --------------------------------------------------------------------------------------
# The independent replay
# --------------------------------------------------------------------------------------

def contract_order(end: dict) -> tuple:
    """Commit order: (scn, thread, sequence, rba) of the COMMIT."""
    return end["scn"], end["thread"], end["sequence"], end["rba"]


def replay(archive: Archive, commit_order=contract_order) -> dict[str, list[dict]]:
    """Apply the committed transactions in commit order, each with its surviving changes."""
    keys, columns = archive.keys(), archive.columns()
    state: dict[str, dict[tuple, dict]] = {name: {} for name in keys}
    committed = [t for t in transactions(archive).values() if t.committed]
    committed.sort(key=lambda t: commit_order(t.end))
    for txn in committed:
        for change in txn.surviving_changes():
            apply_change(state, keys, columns, change)
    return {name: list(rows.values()) for name, rows in state.items()}


# --------------------------------------------------------------------------------------
# Fixtures: the same small archive twice, and one with another seed
# --------------------------------------------------------------------------------------

def run(directory: Path, **options):
    return simulate(directory / "archive", directory / "truth.json", records=RECORDS, hours=HOURS,
                    segment_minutes=SEGMENT_MINUTES, start=START, **options)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    directory = tmp_path_factory.mktemp("simulated")
    summary = run(directory)
    return summary, read_archive(directory / "archive"), json.loads((directory / "truth.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def summary(simulated):
    return simulated[0]


@pytest.fixture(scope="module")
def archive(simulated):
    return simulated[1]


@pytest.fixture(scope="module")
def truth(simulated):
    return simulated[2]


@pytest.fixture(scope="module")
def txns(archive):
    return transactions(archive)


# --------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------

def test_same_seed_writes_identical_bytes(simulated, tmp_path):
    summary = simulated[0]
    run(tmp_path)
    assert file_digests(tmp_path / "archive") == file_digests(summary.archive_dir)
    assert (tmp_path / "truth.json").read_bytes() == summary.truth_path.read_bytes()


def test_another_seed_writes_another_archive(simulated, tmp_path):
    summary = simulated[0]
    run(tmp_path, seed=8)
    ours, theirs = file_digests(summary.archive_dir), file_digests(tmp_path / "archive")
    assert ours[DEFS_FILE] == theirs[DEFS_FILE]  # same tables
    different = [name for name in ours if name != DEFS_FILE and ours[name] != theirs.get(name)]
    assert len(different) > len(ours) // 2
    assert (tmp_path / "truth.json").read_bytes() != summary.truth_path.read_bytes()


def test_refuses_to_write_over_an_archive(summary):
    with pytest.raises(FileExistsError):
        simulate(summary.archive_dir, summary.archive_dir.parent / "other-truth.json", records=100)


# --------------------------------------------------------------------------------------
# Contract conformance of what is written
# --------------------------------------------------------------------------------------

def test_defs_are_postgres_tables(archive):
    tables = archive.defs["tables"]
    names = [t["name"] for t in tables]
    assert len(names) == len(set(names))
    for table in tables:
        columns = [c["name"] for c in table["columns"]]
        assert set(table["key"]) <= set(columns)
        assert {c["type"] for c in table["columns"]} <= PG_TYPES
        assert all(isinstance(c["nullable"], bool) for c in table["columns"])
    assert any(t["key"] == [] for t in tables), "a table without a key"
    assert any(len(t["key"]) > 1 for t in tables), "a composite key"
    assert {name.split(".")[0] for name in names} == {"shop", "hr"}
    kunden = next(t for t in tables if t["name"] == 'shop.Kunden "Prüfung"')
    assert {"select", "Mixed Case", "naïve"} <= {c["name"] for c in kunden["columns"]}


def test_manifests_match_their_data_files(archive):
    for (thread, sequence), manifest in archive.manifests.items():
        assert set(MANIFEST_FIELDS) <= set(manifest) <= set(MANIFEST_FIELDS) | set(MANIFEST_OPTIONAL)
        assert (manifest["thread"], manifest["sequence"]) == (thread, sequence)
        data = (archive.path / f"arch_{thread}_{sequence:09d}.{manifest['format']}").read_bytes()
        assert manifest["bytes"] == len(data)
        assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
        records = [r for r in archive.records if (r["thread"], r["sequence"]) == (thread, sequence)]
        assert manifest["records"] == len(records)
        assert parse_time(manifest["first_time"]) <= parse_time(manifest["next_time"])
    # nothing but segments (data + manifest pairs) and defs.json
    names = {f.name for f in archive.path.iterdir()}
    assert len(names) == 2 * len(archive.manifests) + 1
    assert all(SEGMENT_RE.match(name) for name in names - {DEFS_FILE})


def test_parquet_schema(archive):
    schema = pq.read_schema(next(archive.path.glob("*.parquet")))
    assert schema.names == list(RECORD_FIELDS)
    assert [f.type for f in schema] == [pa.int64(), pa.int64(), pa.timestamp("us", tz="UTC")] + [pa.string()] * 6


def test_mixed_mode_uses_both_encodings(archive):
    for thread in archive.threads():
        assert {m["format"] for m in archive.thread_manifests(thread)} == {"parquet", "jsonl"}


def test_segment_chains(archive):
    assert archive.threads() == [1, 2, 3]
    for thread in archive.threads():
        manifests = archive.thread_manifests(thread)
        assert [m["sequence"] for m in manifests] == list(range(1, len(manifests) + 1))
        assert parse_time(manifests[0]["first_time"]) == START
        for previous, current in zip(manifests, manifests[1:]):
            assert current["first_scn"] == previous["next_scn"]
            assert current["first_time"] == previous["next_time"]
        last_scn = 0
        for manifest in manifests:
            records = [r for r in archive.records if (r["thread"], r["sequence"]) == (thread, manifest["sequence"])]
            assert [r["rba"] for r in records] == list(range(len(records)))
            first, after_last = parse_time(manifest["first_time"]), parse_time(manifest["next_time"])
            for record in records:
                assert manifest["first_scn"] <= record["scn"] < manifest["next_scn"]
                assert record["scn"] >= last_scn, "scn goes backwards within a thread"
                last_scn = record["scn"]
                assert first <= record["ts"] < after_last


def test_segments_switch_on_log_time(archive):
    expected = HOURS * 60 / SEGMENT_MINUTES
    for thread in (1, 2):  # threads that run to the end
        manifests = archive.thread_manifests(thread)
        assert abs(len(manifests) - expected) <= 1
        assert parse_time(manifests[-1]["next_time"]) == START + timedelta(hours=HOURS)
        spans = [parse_time(m["next_time"]) - parse_time(m["first_time"]) for m in manifests[1:-1]]
        assert set(spans) == {timedelta(minutes=SEGMENT_MINUTES)}


def test_records_are_valid(archive, txns):
    tables = set(archive.keys())
    ended: dict[str, int] = {}
    for position, record in enumerate(archive.records):
        assert record["op"] in OPS
        assert 1 <= len(record["xid"]) <= 128
        if record["op"] in DML_OPS:
            assert record["table"] in tables
        else:
            assert record["table"] is None and record["before"] is None and record["after"] is None
        if record["op"] == "COMMIT":
            assert record["parent_xid"] is None, "COMMIT of a subtransaction"
        assert record["xid"] not in ended, f"record of {record['xid']!r} after its end"
        if record["op"] in ("COMMIT", "ROLLBACK"):
            ended[record["xid"]] = position
    subtransactions = {r["xid"] for r in archive.records if r["parent_xid"] is not None}
    tops = {r["xid"] for r in archive.records if r["parent_xid"] is None}
    assert not subtransactions & tops, "an xid is both a transaction and a subtransaction"
    for txn in txns.values():
        assert len({r["thread"] for r in txn.records}) == 1, "a transaction spans threads"


def test_open_transactions_never_touch_the_same_row(archive):
    """Like a real database: a row (or a truncated table) touched by an open transaction is
    left alone by the others until it ends. Otherwise the final state would depend on more
    than the commit order. Records in (scn, thread, sequence, rba) order are a valid
    serialisation of what happened, so walk them in that order."""
    keys, columns = archive.keys(), archive.columns()
    holder: dict[tuple, str] = {}                 # (table, row identity) -> top-level xid
    held: dict[str, set[tuple]] = defaultdict(set)
    truncated_by: dict[str, str] = {}             # table -> top-level xid
    for record in sorted(archive.records, key=lambda r: (r["scn"], r["thread"], r["sequence"], r["rba"])):
        xid = record["parent_xid"] or record["xid"]
        if record["op"] in ("COMMIT", "ROLLBACK") and record["parent_xid"] is None:
            for row in held.pop(xid, []):
                del holder[row]
            truncated_by = {t: x for t, x in truncated_by.items() if x != xid}
            continue
        if record["op"] not in DML_OPS:
            continue
        name = record["table"]
        assert truncated_by.get(name, xid) == xid, f"{name} touched while truncated by an open transaction"
        if record["op"] == "TRUNCATE":
            assert all(x == xid for (t, _), x in holder.items() if t == name), f"TRUNCATE of {name} in use"
            truncated_by[name] = xid
            continue
        for image in (record["before"], record["after"]):
            if image is not None:
                row = (name, row_identity(keys[name], columns[name], json.loads(image)))
                owner = holder.setdefault(row, xid)
                assert owner == xid, f"{row} changed by {xid!r} while {owner!r} is open"
                held[xid].add(row)


def test_images_follow_the_contract(archive):
    keys, columns = archive.keys(), archive.columns()
    for record in archive.records:
        op, name = record["op"], record["table"]
        before = json.loads(record["before"]) if record["before"] is not None else None
        after = json.loads(record["after"]) if record["after"] is not None else None
        if op == "INSERT":
            assert before is None and list(after) == columns[name]
        elif op == "UPDATE":
            assert set(keys[name] or columns[name]) <= set(before) <= set(columns[name])
            assert set(keys[name]) <= set(after) <= set(columns[name])
        elif op == "DELETE":
            assert after is None and set(keys[name] or columns[name]) <= set(before)
        elif op == "TRUNCATE":
            assert before is None and after is None


# --------------------------------------------------------------------------------------
# Every hard case really occurs
# --------------------------------------------------------------------------------------

def test_threads_interleave_and_share_commit_scns(archive, txns):
    commit_threads = defaultdict(set)
    for record in archive.records:
        if record["op"] == "COMMIT":
            commit_threads[record["scn"]].add(record["thread"])
    assert sum(len(threads) > 1 for threads in commit_threads.values()) >= 5
    # records of different transactions interleave within a thread
    interleaved = [t for t in txns.values()
                   if t.records[-1]["position"] - t.records[0]["position"] + 1 > len(t.records)]
    assert len(interleaved) > len(txns) // 2


def test_rollbacks_and_savepoints(txns):
    rolled_back = [t for t in txns.values() if t.rolled_back]
    assert len(rolled_back) >= 20
    rolled_back_subs = [sub for t in txns.values() for sub in t.rolled_back_subs]
    assert len(rolled_back_subs) >= 20

    # nested savepoints rolled back together: adjacent ROLLBACKs of subtransactions
    nested = 0
    for txn in txns.values():
        ops = [(r["op"], r["parent_xid"] is not None) for r in txn.records]
        nested += any(ops[i] == ops[i + 1] == ("ROLLBACK", True) for i in range(len(ops) - 1))
    assert nested >= 3

    # released savepoints: subtransactions that wrote, were not rolled back, and committed
    released = [
        r["xid"] for t in txns.values() if t.committed for r in t.records
        if r["parent_xid"] is not None and r["op"] in DML_OPS and r["xid"] not in t.rolled_back_subs
    ]
    assert len(set(released)) >= 10


def test_begin_is_optional(txns):
    with_begin = sum(t.records[0]["op"] == "BEGIN" for t in txns.values())
    assert 0.1 * len(txns) < with_begin < 0.9 * len(txns)


def test_long_and_open_transactions(txns):
    def segments_spanned(txn):
        sequences = [r["sequence"] for r in txn.records]
        return max(sequences) - min(sequences) + 1

    def hours_spanned(txn):
        return (txn.records[-1]["ts"] - txn.records[0]["ts"]) / timedelta(hours=1)

    assert sum(t.committed and segments_spanned(t) >= 10 for t in txns.values()) >= 2
    assert max(hours_spanned(t) for t in txns.values() if t.committed) > 0.5 * HOURS
    assert any(t.rolled_back and hours_spanned(t) >= 2 for t in txns.values())
    open_at_end = [t for t in txns.values() if t.end is None]
    assert any(segments_spanned(t) >= 10 for t in open_at_end)
    assert len(open_at_end) >= 2


def test_primary_key_updates(archive):
    keys = archive.keys()
    moved = Counter()
    for record in archive.records:
        if record["op"] == "UPDATE" and keys[record["table"]]:
            before, after = json.loads(record["before"]), json.loads(record["after"])
            if any(before[k] != after[k] for k in keys[record["table"]]):
                moved[record["table"]] += 1
    assert len(moved) >= 3 and sum(moved.values()) >= 20
    assert "shop.order_lines" in moved  # a composite key


def test_update_images_are_partial_or_whole(archive):
    keys, columns = archive.keys(), archive.columns()
    key_only_before = full_before = partial_after = 0
    for record in archive.records:
        if record["op"] == "UPDATE" and keys[record["table"]]:
            before, after = json.loads(record["before"]), json.loads(record["after"])
            key_only_before += set(before) == set(keys[record["table"]])
            full_before += set(before) == set(columns[record["table"]])
            partial_after += set(after) < set(columns[record["table"]])
    assert key_only_before >= 50 and full_before >= 50 and partial_after >= 100
    # large values are not repeated when they do not change
    large = [r for r in archive.records if r["op"] in ("INSERT", "UPDATE") and len(r["after"]) > 10_000]
    assert large


def test_keyless_table(archive, truth):
    keyless = [name for name, key in archive.keys().items() if not key]
    changes = Counter(r["op"] for r in archive.records if r["table"] in keyless)
    assert changes["INSERT"] and changes["UPDATE"] >= 10 and changes["DELETE"] >= 10
    for name in keyless:
        rows = truth["tables"][name]["rows"]
        assert len(canonical(rows)) == len(set(canonical(rows))), "rows of a keyless table are unique"


def test_truncates(txns):
    truncating = [t for t in txns.values() if any(r["op"] == "TRUNCATE" for r in t.records)]
    assert sum(t.committed for t in truncating) >= 3
    assert sum(t.rolled_back for t in truncating) >= 1
    # a TRUNCATE undone by a rollback to savepoint, in a transaction that commits
    assert any(t.committed and any(r["op"] == "TRUNCATE" and r["xid"] in t.rolled_back_subs for r in t.records)
               for t in truncating)


def test_idle_and_closed_threads(archive):
    closed = [(key, m) for key, m in archive.manifests.items() if m.get("closed")]
    assert len(closed) == 1
    (thread, sequence), manifest = closed[0]
    assert thread == 3 and sequence == len(archive.thread_manifests(3)), "closed is the thread's last segment"
    assert parse_time(manifest["next_time"]) < START + timedelta(hours=HOURS * 0.8)
    # quiet stretches: several empty segments in a row while the other threads are busy
    empty_run = longest = 0
    for m in archive.thread_manifests(3):
        empty_run = empty_run + 1 if m["records"] == 0 else 0
        longest = max(longest, empty_run)
    assert longest >= 4
    assert all(m["records"] > 0 for t in (1, 2) for m in archive.thread_manifests(t))


def test_hostile_xids(archive):
    xids = {r["xid"] for r in archive.records}
    assert any("/" in x for x in xids) and any("\\" in x for x in xids)
    assert any(".." in x for x in xids) and any(" " in x for x in xids)
    assert any(not x.isascii() for x in xids)
    assert any(len(x) == 128 for x in xids) and any(len(x) == 1 for x in xids)


def test_hr_only_transactions(txns):
    def schemas(txn):
        return {r["table"].split(".")[0] for r in txn.records if r["table"]}
    assert sum(t.committed and schemas(t) == {"hr"} for t in txns.values()) >= 20
    assert sum(t.committed and schemas(t) == {"shop"} for t in txns.values()) >= 20


def test_awkward_values(archive):
    values = defaultdict(list)  # column type -> values seen
    types = {t["name"]: {c["name"]: c["type"] for c in t["columns"]} for t in archive.defs["tables"]}
    for record in archive.records:
        if record["op"] == "INSERT":
            for column, value in json.loads(record["after"]).items():
                values[types[record["table"]][column]].append(value)
    text = [v for v in values["text"] if isinstance(v, str)]
    assert any("'" in v for v in text) and any('"' in v for v in text) and any("\\" in v for v in text)
    assert any("\u0301" in v for v in text) and any("🚀" in v for v in text) and any("北京" in v for v in text)
    assert "" in values["text"] and None in values["text"]  # empty string and NULL differ
    assert any(len(v.replace("-", "").replace(".", "").lstrip("0")) >= 20 for v in values["numeric"])
    assert all(isinstance(v, str) for v in values["numeric"])
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\+00", v) for v in values["timestamptz"])
    assert all(v is None or re.fullmatch(r"\d{4}-\d\d-\d\d", v) for v in values["date"])
    assert any(v and re.fullmatch(r"\\x[0-9a-f]{16}", v) for v in values["bytea"])
    assert any(isinstance(v, float) for v in values["double precision"])
    assert {True, False} <= set(values["boolean"])
    assert any(v and v.startswith("{") for v in values["integer[]"] + values["text[]"])
    assert any(v and json.loads(v) for v in values["jsonb"])
    assert any(isinstance(v, int) and abs(v) > 2 ** 53 for v in values["bigint"])


# --------------------------------------------------------------------------------------
# The truth
# --------------------------------------------------------------------------------------

def test_truth_shape(archive, truth, txns):
    assert truth["format"] == 1 and truth["seed"] == 7 and truth["records"] == RECORDS
    assert list(truth["tables"]) == [t["name"] for t in archive.defs["tables"]]
    for table in archive.defs["tables"]:
        entry = truth["tables"][table["name"]]
        assert entry["key"] == table["key"]
        assert entry["columns"] == [c["name"] for c in table["columns"]]
        assert all(list(row) == entry["columns"] for row in entry["rows"])
    commits = [t.end for t in txns.values() if t.committed]
    assert truth["transactions"] == {
        "committed": len(commits),
        "rolled_back": sum(t.rolled_back for t in txns.values()),
        "open_at_end": sum(t.end is None for t in txns.values()),
    }
    assert truth["last_csn"] == max(c["scn"] for c in commits)


def test_replay_of_the_raw_archive_reaches_the_truth(archive, truth):
    replayed = replay(archive)
    assert sum(len(rows) for rows in replayed.values()) > 1000
    for name, rows in replayed.items():
        assert canonical(rows) == canonical(truth["tables"][name]["rows"]), name


def test_the_commit_tie_break_matters(archive, truth, txns):
    """Transactions on different threads that commit at the same SCN change the same rows:
    breaking the tie the wrong way (higher thread first) must give another state, or fail
    outright on a change to a row that is not there (yet) or is there already."""
    def wrong_order(end):
        return end["scn"], -end["thread"], end["sequence"], end["rba"]

    keys, columns = archive.keys(), archive.columns()
    touched: dict[int, dict[int, set]] = {}  # commit scn -> thread -> (table, key) touched
    for txn in txns.values():
        if txn.committed:
            rows = touched.setdefault(txn.end["scn"], {}).setdefault(txn.end["thread"], set())
            for change in txn.surviving_changes():
                image = json.loads(change["after"] or change["before"] or "{}")
                if change["op"] != "TRUNCATE" and all(c in image for c in keys[change["table"]] or columns[change["table"]]):
                    rows.add((change["table"], row_identity(keys[change["table"]], columns[change["table"]], image)))
    conflicts = [scn for scn, threads in touched.items() if len(threads) > 1
                 and any(a & b for t, a in threads.items() for u, b in threads.items() if t < u)]
    assert conflicts, "the simulator must commit same-SCN transactions on different threads touching one row"
    try:
        replayed = replay(archive, wrong_order)
    except KeyError:
        return  # an UPDATE/DELETE of a row the wrong order has not inserted yet: the order matters
    except AssertionError as exc:
        assert "existing row" in str(exc), exc  # an INSERT of a row the wrong order has not deleted yet
        return
    assert any(canonical(rows) != canonical(truth["tables"][name]["rows"]) for name, rows in replayed.items())


def test_summary(summary, archive, truth):
    assert summary.records == RECORDS == len(archive.records)
    assert summary.segments == {t: len(archive.thread_manifests(t)) for t in archive.threads()}
    assert summary.bytes == sum(m["bytes"] for m in archive.manifests.values())
    assert summary.committed == truth["transactions"]["committed"]
    assert summary.last_scn == max(r["scn"] for r in archive.records)
    assert summary.first_time == START and summary.last_time == START + timedelta(hours=HOURS)
    assert f"{RECORDS:,} records" in summary.describe()


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_single_encoding_and_record_cap(tmp_path, fmt):
    summary = simulate(tmp_path / "archive", tmp_path / "truth.json", records=3_000, hours=4,
                       fmt=fmt, segment_records=40, threads=2, close_last_thread_at=None)
    archive = read_archive(tmp_path / "archive")
    assert {m["format"] for m in archive.manifests.values()} == {fmt}
    assert max(m["records"] for m in archive.manifests.values()) == 40
    assert archive.threads() == [1, 2] and not any(m.get("closed") for m in archive.manifests.values())
    for thread in archive.threads():
        manifests = archive.thread_manifests(thread)
        assert all(b["first_scn"] == a["next_scn"] for a, b in zip(manifests, manifests[1:]))
    truth = json.loads((tmp_path / "truth.json").read_text("utf-8"))
    replayed = replay(archive)
    assert all(canonical(rows) == canonical(truth["tables"][name]["rows"]) for name, rows in replayed.items())
    assert summary.records == 3_000
