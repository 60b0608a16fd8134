"""SEND EXTRACT: look at open transactions and leave directives for the next run.

`showtrans` lists what the last run left open, oldest first. `skiptrans` (discard a
transaction: it never reaches the trail) and `forcetrans` (write what it holds as
committed now) are recorded in the metadata store and carried out by the next capture
run, which marks them done in its own commit. `brreset` asks the next run for one normal
recovery. A directive for a transaction that is not open is refused at once.
"""

from __future__ import annotations

from datetime import timedelta

from trailbound.capture import checkpoints as ckpt
from trailbound.errors import TrailboundError
from trailbound.ggsci import utc
from trailbound.metadata import MetadataStore


def _state(cur, group: str) -> ckpt.ExtractState:
    state = ckpt.load(cur, group)
    if state is None:
        raise TrailboundError(f"extract {group} is not added")
    return state


def show_transactions(store: MetadataStore, group: str, *, duration: timedelta | None = None,
                      count: int | None = None) -> str:
    with store.transaction() as cur:
        state = _state(cur, group)
    now = state.read_time
    open_txns = sorted(state.open, key=lambda t: (t.start.ts, t.thread, t.xid))
    if duration is not None and now is not None:
        open_txns = [t for t in open_txns if now - t.start.ts >= duration]
    if count is not None:
        open_txns = open_txns[:count]
    lines = [f"Oldest open transactions of extract {state.group} (log time read: {utc(now) if now else 'not yet'}):"]
    if not open_txns:
        lines.append("  none")
    for txn in open_txns:
        age = str(now - txn.start.ts).split(".")[0] if now else "?"
        notes = [n for n in (("persisted" if txn.persisted else ""), txn.skip_reason or "") if n]
        lines.append(f"  XID {txn.xid!r}  thread {txn.thread}  start {txn.start.position} scn {txn.start.scn} "
                     f"at {utc(txn.start.ts)}  age {age}  records {txn.records}  bytes {txn.bytes}"
                     + (f"  ({'; '.join(notes)})" if notes else ""))
    return "\n".join(lines)


def request(store: MetadataStore, group: str, kind: str, xid: str | None = None, thread: int | None = None) -> str:
    """Record a directive; refuse one that names no open transaction."""
    with store.transaction() as cur:
        state = _state(cur, group)
        if kind in ("skiptrans", "forcetrans"):
            matches = [t for t in state.open if t.xid == xid and (thread is None or t.thread == thread)]
            if not matches:
                raise TrailboundError(f"transaction {xid!r} is not open in extract {state.group} (unknown, or it "
                                      "already committed or rolled back); see `send extract ... showtrans`")
            if len(matches) > 1:
                raise TrailboundError(f"transaction {xid!r} is open in threads "
                                      f"{', '.join(str(t.thread) for t in matches)}: name one with --thread")
            txn = matches[0]
            if txn.skip_reason:
                raise TrailboundError(f"transaction {xid!r} is already excluded: {txn.skip_reason}")
            thread = txn.thread
            pending = [d for d in state.directives if d.xid == xid and d.kind in ("skiptrans", "forcetrans")]
            if pending:
                raise TrailboundError(f"transaction {xid!r} already has a pending {pending[0].kind}")
        cur.execute("INSERT INTO trailbound.extract_directive (group_name, kind, xid, thread) VALUES (%s, %s, %s, %s)"
                    " RETURNING directive_id", (state.group, kind, xid, thread))
        directive_id = cur.fetchone()["directive_id"]
    target = f" for transaction {xid!r} (thread {thread})" if xid is not None else ""
    return f"EXTRACT {state.group}: {kind}{target} recorded as directive {directive_id}; the next run applies it"


def directive_results(store: MetadataStore, group: str, limit: int = 20) -> list[dict]:
    with store.transaction() as cur:
        cur.execute("SELECT * FROM trailbound.extract_directive WHERE upper(group_name) = upper(%s)"
                    " ORDER BY directive_id DESC LIMIT %s", (group, limit))
        return cur.fetchall()
