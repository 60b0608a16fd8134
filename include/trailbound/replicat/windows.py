"""Replicat's side of a watermark load (Netflix's DBLog): each chunk's rows are applied at
its high watermark's place in commit order, minus every key the log changed inside the
chunk's window.

The load writes a low watermark row into the source's watermark table
(`trailbound.load_watermark`, published and captured like any table, so its writes
reach the trail in commit order), reads the chunk into a staging table in the target,
then turns the row into a high watermark. Replicat, applying the trail:

- at a low watermark, opens the window (`trailbound_load.open_window` in the target);
- for every later change to the window's table, records its key
  (`trailbound_load.changed_key`); a TRUNCATE marks the whole window changed;
- at the high watermark (which always ends its target transaction: chunks.py), applies
  the window: in the chunk's key range, every target row and staged row whose key the
  log did not change since the low watermark is replaced by the staged row, or deleted
  when the chunk does not hold it; the log's version of a changed key wins.
- a deleted watermark row (the load cleaning up) closes a window that never got its
  high watermark (a load killed in between, whose chunk was copied again).

All of it happens inside the target transaction of the records that caused it, with
the checkpoint row: a run killed anywhere leaves the windows exactly as the checkpoint
says, and nothing is applied twice. Why the result is right: a key not changed between
the watermarks had the same row all through the window, so the chunk's copy of it, read
inside the window, is its state at the high watermark; a key changed in the window is
already in the target as the log left it.

The load (load/run.py, load/copy.py) takes the watermark table, the window tables and
the staging tables' names from here. Imports nothing from `sources/` or `load/`.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql
from psycopg2.extras import execute_values

from trailbound.errors import TrailboundError
from trailbound.keyranges import key_row, range_condition

log = logging.getLogger("trailbound.load")
STAGING_SCHEMA = "trailbound_load"
_WINDOW_ID = re.compile(r"^[0-9a-f]{32}$")
_HIGH = r'"mark"\s*:\s*"high"'


@dataclass(frozen=True)
class _Table:
    schema: str
    table: str

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)


WATERMARK = _Table("trailbound", "load_watermark")
OPEN_WINDOW = _Table(STAGING_SCHEMA, "open_window")
CHANGED_KEY = _Table(STAGING_SCHEMA, "changed_key")

WATERMARK_DDL = sql.SQL("""
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {table} (
    window_id     text        PRIMARY KEY,
    source_table  text        NOT NULL,
    mark          text        NOT NULL CHECK (mark IN ('low', 'high')),
    lo            text,
    hi            text,
    written_at    timestamptz NOT NULL DEFAULT now()
)""").format(schema=sql.Identifier(WATERMARK.schema), table=WATERMARK.ident)

_STATE_DDL = sql.SQL("""
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {open} (
    window_id     text    PRIMARY KEY,
    source_table  text    NOT NULL,
    lo            jsonb,
    hi            jsonb,
    truncated     boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS {changed} (
    window_id  text  NOT NULL,
    key        jsonb NOT NULL,
    PRIMARY KEY (window_id, key)
)""").format(schema=sql.Identifier(STAGING_SCHEMA), open=OPEN_WINDOW.ident, changed=CHANGED_KEY.ident)


def staging_table(window_id: str) -> sql.Identifier:
    """The target table holding one window's chunk (the id is ours: 32 hex digits)."""
    if not _WINDOW_ID.match(window_id):
        raise TrailboundError(f"{window_id!r} is not a load window id")
    return sql.Identifier(STAGING_SCHEMA, f"w_{window_id}")


def create_state(cur) -> None:
    """The target's window tables (the load creates them before its first chunk)."""
    cur.execute(_STATE_DDL)


def high_watermarks(records: pa.Table) -> np.ndarray:
    """Per trail record: does it write a high watermark (its transaction ends a group)."""
    if not len(records):
        return np.zeros(0, dtype=bool)
    mask = pc.and_(pc.equal(records.column("table"), WATERMARK.name),
                   pc.match_substring_regex(pc.fill_null(records.column("after"), ""), _HIGH))
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass
class _Window:
    window_id: str
    source_table: str
    lo: dict | None
    hi: dict | None


def _slice(chunk, records: pa.Table, txns: list[int]) -> pa.Table:
    """The records of `txns`, taken from `records` (the chunk's, light or whole)."""
    starts, n = chunk.txn_starts, len(records)
    stop = lambda t: int(starts[t + 1]) if t + 1 < len(starts) else n  # noqa: E731
    if txns == list(range(txns[0], txns[-1] + 1)):
        first = int(starts[txns[0]])
        return records.slice(first, stop(txns[-1]) - first)
    return pa.concat_tables([records.slice(int(starts[t]), stop(t) - int(starts[t])) for t in txns])


class Windows:
    """Applies the load windows that a target transaction's records open, feed and close."""

    def __init__(self, plans: dict):
        self.plans = plans            # source table -> replicat.target.TablePlan (or None: not mapped)
        self._present: bool | None = None  # the window tables exist (None: look)

    def _exists(self, cur) -> bool:
        if self._present is None:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (OPEN_WINDOW.ident.as_string(cur),))
            self._present = cur.fetchone()[0]
        return self._present

    def quiet(self, cur, chunk) -> bool:
        """No load window can be touched by the chunk: none is open in the target, and the
        chunk writes no watermark (then its groups may be applied in parallel: nothing
        can open a window before the chunk's end)."""
        if pc.any(pc.fill_null(pc.equal(chunk.light.column("table"), WATERMARK.name), False)).as_py():
            return False
        if not self._exists(cur):
            return True
        cur.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(OPEN_WINDOW.ident))
        return not cur.fetchone()[0]

    def apply(self, cur, chunk, txns: list[int]) -> None:
        """Inside the target transaction applying `txns` of `chunk`, after their rows and
        before the checkpoint row."""
        if not txns:
            return
        # The table names first, from the records without their images (decoded only if
        # a window is open or a watermark passes).
        tables = _slice(chunk, chunk.light, txns).column("table")
        has_watermark = pc.any(pc.equal(tables, WATERMARK.name)).as_py()
        if not self._exists(cur):
            if not has_watermark:
                return  # no load has ever reached this target: one look per run
            create_state(cur)
            self._present = None  # look again next time: this transaction may still roll back
        cur.execute(sql.SQL("SELECT window_id, source_table, lo, hi FROM {}").format(OPEN_WINDOW.ident))
        open_windows = {w: _Window(w, t, lo, hi) for w, t, lo, hi in cur.fetchall()}
        if not open_windows and not has_watermark:
            return
        records = _slice(chunk, chunk.records, txns)
        # the tables of windows open already, and of windows a low watermark here opens
        marks = records.filter(pc.fill_null(pc.equal(tables, WATERMARK.name), False)).column("after").to_pylist()
        opening = {json.loads(after).get("source_table") for after in marks if after}
        relevant = pa.array(sorted({WATERMARK.name} | {w.source_table for w in open_windows.values()}
                                   | (opening - {None})))
        rows = records.filter(pc.fill_null(pc.is_in(tables, value_set=relevant), False)) \
            .select(["op", "table", "before", "after"]).to_pylist()
        changed: dict[str, set[str]] = {}
        latest: dict[tuple[str, str], str | None] = {}  # (table, key) -> its last after image here
        for row in rows:
            if row["table"] == WATERMARK.name:
                if row["op"] == "UPDATE":
                    self._restore(cur, latest)
                self._watermark(cur, row, open_windows, changed)
                continue
            for window in [w for w in open_windows.values() if w.source_table == row["table"]]:
                if row["op"] == "TRUNCATE":
                    cur.execute(sql.SQL("UPDATE {} SET truncated = true WHERE window_id = %s").format(
                        OPEN_WINDOW.ident), (window.window_id,))
                    continue
                keys = self._keys(window, row)
                changed.setdefault(window.window_id, set()).update(keys)
                for key in keys:
                    latest[row["table"], key] = row["after"] if row["op"] != "DELETE" else None
        self._restore(cur, latest)
        self._save_keys(cur, changed)

    # ---------------------------------------------------------------- watermark records

    def _watermark(self, cur, row: dict, open_windows: dict, changed: dict) -> None:
        image = json.loads(row["after"] or row["before"] or "{}")
        window_id = image.get("window_id")
        if row["op"] == "INSERT" and image.get("mark") == "low":
            lo, hi = (json.loads(image[b]) if image.get(b) else None for b in ("lo", "hi"))
            cur.execute(sql.SQL("INSERT INTO {} (window_id, source_table, lo, hi) VALUES (%s, %s, %s, %s)"
                                " ON CONFLICT (window_id) DO NOTHING").format(OPEN_WINDOW.ident),
                        (window_id, image["source_table"], json.dumps(lo) if lo else None,
                         json.dumps(hi) if hi else None))
            open_windows[window_id] = _Window(window_id, image["source_table"], lo, hi)
        elif row["op"] == "UPDATE" and image.get("mark") == "high":
            window = open_windows.pop(window_id, None)
            if window is None:
                # Its low watermark was never applied here (replicat was repositioned past it):
                # which keys the log changed is unknown, so the chunk is not applied.
                log.warning("load window %s (%s): high watermark without its low watermark; its chunk is not "
                            "applied (load the table again)", window_id, image.get("source_table"))
                return
            self._save_keys(cur, {window_id: changed.pop(window_id, set())})
            self._apply_window(cur, window)
        elif row["op"] == "DELETE" and window_id in open_windows:
            self._close(cur, open_windows.pop(window_id))
            changed.pop(window_id, None)

    def _keys(self, window: _Window, row: dict) -> set[str]:
        key = self._plan(window).key
        found = set()
        for image in (row["before"], row["after"]):
            if image:
                values = json.loads(image)
                if all(column in values for column in key):
                    found.add(json.dumps({column: values[column] for column in key}, sort_keys=True))
        return found

    def _plan(self, window: _Window):
        plan = self.plans.get(window.source_table)
        if plan is None:
            raise TrailboundError(f"load window {window.window_id}: source table {window.source_table} is not mapped "
                                  "to a target table by the replicat's MAP")
        return plan

    def _save_keys(self, cur, changed: dict[str, set[str]]) -> None:
        values = [(window_id, key) for window_id, keys in changed.items() for key in sorted(keys)]
        if values:
            execute_values(cur, sql.SQL("INSERT INTO {} (window_id, key) VALUES %s ON CONFLICT DO NOTHING").format(
                CHANGED_KEY.ident).as_string(cur), values, template="(%s, %s::jsonb)")

    def _restore(self, cur, latest: dict) -> None:
        """A key the log changed inside a window is left out of the chunk: the target must
        hold the log's version. Before its chunk is applied the row may not be in the
        target at all (a table being loaded), and HANDLECOLLISIONS skipped the UPDATE of
        a missing row: put the update's whole new row in (an image without a TOASTed
        column it did not change cannot be, and is logged)."""
        for (table, key), after in latest.items():
            if after is None:
                continue
            plan = self.plans.get(table)
            values = json.loads(after)
            if plan is None or not set(plan.columns) <= set(values):
                log.warning("load: %s key %s changed inside a load window with a partial row image (an unchanged "
                            "TOASTed column); if the target lacks the row, load that key range again", table, key)
                continue
            columns = sql.SQL(", ").join(map(sql.Identifier, plan.columns))
            picked = sql.SQL(", ").join(sql.Identifier("r", c) for c in plan.columns)
            cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM jsonb_populate_record(NULL::{}, %s::jsonb) r"
                                " WHERE NOT EXISTS (SELECT 1 FROM {} t WHERE {} = {})").format(
                plan.ident, columns, picked, plan.ident, plan.ident, key_row(plan.key, "t"), key_row(plan.key, "r")),
                (after,))
        latest.clear()

    # ---------------------------------------------------------------- applying a window

    def _apply_window(self, cur, window: _Window) -> None:
        plan = self._plan(window)
        staging = staging_table(window.window_id)
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (staging.as_string(cur),))
        if not cur.fetchone()[0]:
            raise TrailboundError(f"load window {window.window_id} of {window.source_table}: its high watermark is "
                                  f"in the trail but its staging table {staging.as_string(cur)} is not in the target")
        cur.execute(sql.SQL("SELECT truncated FROM {} WHERE window_id = %s").format(OPEN_WINDOW.ident),
                    (window.window_id,))
        truncated = cur.fetchone()[0]
        if not truncated:  # truncated in the window: the log alone says what the table holds
            target, key = plan.ident, list(plan.key)
            columns = sql.SQL(", ").join(map(sql.Identifier, plan.columns))
            changed = sql.SQL("SELECT {} FROM {} c, jsonb_populate_record(NULL::{}, c.key) r"
                              " WHERE c.window_id = %s").format(
                sql.SQL(", ").join(sql.Identifier("r", k) for k in key), CHANGED_KEY.ident, target)
            condition, params = range_condition(target, key, window.lo, window.hi, alias="t")
            cur.execute(sql.SQL("DELETE FROM {} t WHERE {} AND {} NOT IN ({})").format(
                target, condition, key_row(key, "t"), changed), [*params, window.window_id])
            cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} s WHERE {} NOT IN ({})").format(
                target, columns, columns, staging, key_row(key, "s"), changed), [window.window_id])
        self._close(cur, window)

    def _close(self, cur, window: _Window) -> None:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(staging_table(window.window_id)))
        cur.execute(sql.SQL("DELETE FROM {} WHERE window_id = %s").format(CHANGED_KEY.ident), (window.window_id,))
        cur.execute(sql.SQL("DELETE FROM {} WHERE window_id = %s").format(OPEN_WINDOW.ident), (window.window_id,))
