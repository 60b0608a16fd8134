"""INFO REPLICAT [SHOWCH [N]]: a group's status, and its two checkpoints side by side:
the checkpoint table's row in the target and the file checkpoint in the metadata store."""

from __future__ import annotations

from datetime import datetime, timezone

from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.ggsci import header, lag, times_note, timestamp, utc
from trailbound.metadata import MetadataStore
from trailbound.replicat import checkpoint_table as ckt
from trailbound.replicat import checkpoints as ckpt
from trailbound.replicat import discards as dsc
from trailbound.replicat.loadinfo import load_in_progress
from trailbound.replicat import target as tgt
from trailbound import files as trailfs
from trailbound.runlog import run_state


_TIMES = times_note("the Log Read Checkpoint and Audit TS (the source commit time of the last applied "
                    "transaction)", "Last Started, Timestamp, Last update, created and the run history")

def _checkpoint_row(config: Config, table: str, group: str, target_dsn: str | None):
    """(row or None, a note when it cannot be read, the group's outstanding discards per
    target table)."""
    try:
        connection = tgt.connect(config, target_dsn)
    except TrailboundError as exc:
        return None, f"target not reachable: {exc}", {}
    try:
        with connection.cursor() as cur:
            name = ckt.CheckpointTableName.parse(table)
            if not ckt.exists(cur, name):
                return None, f"checkpoint table {name} does not exist in the target", {}
            row = ckt.read(cur, name, group)
            return row, None if row else f"no row for {group} in {name} yet", dsc.outstanding(cur, name, group)
    finally:
        connection.close()


def describe_replicat(store: MetadataStore, config: Config, group: str, *, showch: int | None = None,
                      target_dsn: str | None = None) -> str:
    name = config.replicat_name(group)
    with store.transaction() as cur:
        state = ckpt.load(cur, name)
        runs = ckpt.history(cur, name, showch) if showch else []
    if state is None:
        raise TrailboundError(f"replicat {name} is not added (its first run or `alter replicat` adds it)")
    row, note, discarded = _checkpoint_row(config, state.checkpoint_table, name, target_dsn)
    current = ckpt.Checkpoint(row.position, row.log_csn, row.log_bsn, row.audit_ts) if row else state.checkpoint
    lines = [header("replicat", name, state.last_started, run_state(store, "replicat", name))]
    if current.audit_ts is not None:
        updated = row.last_update_ts if row else state.updated_at
        lines.append(f"Checkpoint Lag       {lag((updated - current.audit_ts).total_seconds())} "
                     f"(updated {lag((datetime.now(timezone.utc) - updated).total_seconds())} ago)")
    seqno = current.position.seqno
    where = trailfs.file_location(state.exttrail, seqno) if seqno else f"{state.exttrail} (not started)"
    lines.append(f"Log Read Checkpoint  File {where}")
    lines.append(f"                     {timestamp(current.audit_ts)}  RBA {current.position.rba}")
    lines.append(f"Last applied CSN     {current.log_csn or 'none'}"
                 + (f"  (checkpoint table {state.checkpoint_table})" if row else f"  ({note})"))
    if discarded:
        table = dsc.name_of(ckt.CheckpointTableName.parse(state.checkpoint_table))
        lines.append(f"Discards             {sum(discarded.values())} outstanding in {table} ("
                     + ", ".join(f"{t}: {n}" for t, n in discarded.items()) + f"; `trailbound discards {name}`)")
    lines += load_in_progress(store, name)
    if showch is None:
        return "\n".join(lines + ["", _TIMES])

    f = state.checkpoint
    lines += ["", "Current Checkpoint Detail:", "", "Read Checkpoint #1", "", "    GGS Log Trail"]
    if state.startup is not None:
        lines += ["    Startup Checkpoint (starting position in the trail):",
                  f"        Sequence #: {state.startup.seqno}", f"        RBA: {state.startup.rba}",
                  f"        Timestamp: {timestamp(state.last_started)}", f"        Extract Trail: {state.exttrail}"]
    lines += ["    Current Checkpoint (position of last record read in the trail):",
              f"        Sequence #: {current.position.seqno}", f"        RBA: {current.position.rba}",
              f"        Timestamp: {timestamp(current.audit_ts)}", f"        Extract Trail: {state.exttrail}", ""]

    def value(x) -> str:
        return "-" if x is None or x == [] else str(x)

    width = 22
    lines.append(f"    {'':<{width}} {'checkpoint table (target)':<34} file checkpoint (metadata store)")
    fields = [("Sequence #", row.seqno if row else None, f.position.seqno),
              ("RBA", row.rba if row else None, f.position.rba),
              ("Log CSN", row.log_csn if row else None, f.log_csn),
              ("Log complete CSN", row.log_cmplt_csn if row else None, f.log_csn),
              ("Log complete xids", ", ".join(repr(x) for x in row.log_cmplt_xids) if row else None, None),
              ("Log BSN", row.log_bsn if row else None, f.log_bsn),
              ("Audit TS", timestamp(row.audit_ts) if row and row.audit_ts else None,
               timestamp(f.audit_ts) if f.audit_ts else None),
              ("Last update", timestamp(row.last_update_ts) if row else None, timestamp(state.updated_at))]
    for label, left, right in fields:
        lines.append(f"    {label:<{width}} {value(left):<34} {value(right)}")
    if row is None:
        lines.append(f"    ({note}; the next run starts from the file checkpoint)")
    elif (row.position, row.log_csn) != (f.position, f.log_csn):
        lines.append("    The two differ: the next run starts from the checkpoint table's row (it commits with the "
                     "data) and repairs the file checkpoint.")
    else:
        lines.append("    The two agree.")
    if row is not None:
        lines += ["", f"    Checkpoint table {state.checkpoint_table}: group_key {row.group_key}, version {row.version}, "
                      f"created {utc(row.create_ts)}, current_dir {row.current_dir}"]
    for run in runs:
        lines += ["", f"Checkpoint history: run {run['run_id']} ended {utc(run['ended_at'])}, from the "
                      f"{run['started_from']} at seqno {run['start_seqno']} rba {run['start_rba']} to seqno "
                      f"{run['end_seqno']} rba {run['end_rba']}, log_csn {run['log_csn'] or 'none'}",
                  f"    {run['transactions']} transactions ({run['operations']} records) in {run['groups']} target "
                  f"transactions ({run['parallel_groups']} on parallel sessions), {run['skipped']} skipped, "
                  f"{run['replayed_groups']} group(s) replayed, {run['collisions']} collision(s)"]
    return "\n".join(lines + ["", _TIMES])
