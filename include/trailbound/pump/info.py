"""INFO PUMP [SHOWCH [N]]: a pump's status, its read and write checkpoints, its run history."""

from __future__ import annotations

from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.ggsci import header, times_note, utc
from trailbound.metadata import MetadataStore
from trailbound.pump import checkpoints as pck
from trailbound.runlog import run_state
from trailbound.trail import catalog


_TIMES = times_note("none (a pump reads trail positions)", "Last Started, Timestamp, Start Time, Last Update Time "
                    "and the run history")

def describe_pump(store: MetadataStore, config: Config, group: str, *, showch: int | None = None) -> str:
    name = config.pump_name(group)
    with store.transaction() as cur:
        state = pck.load(cur, name)
        if state is None:
            raise TrailboundError(f"pump {name} is not added (it is added by its first run or `trailbound add pump`)")
        last = catalog.extent(cur, state.exttrail).last
        behind = len(catalog.committed_files(cur, state.exttrail, state.next_source_seqno()))
        runs = pck.history(cur, name, showch) if showch else []
    mode = "PASSTHRU" if config.pump(name).table is None else f"TABLE {', '.join(config.pump(name).table)}"
    lines = [header("pump", name, state.last_started, run_state(store, "pump", name)),
             f"Source Trail         {state.exttrail} (committed up to seqno {last or 0}; "
             f"{behind} file(s) not shipped yet)",
             f"Read Checkpoint      Seqno {state.read.seqno}, RBA {state.read.rba}",
             f"Remote Trail         {state.rmttrail} ({mode})",
             f"Write Checkpoint     Seqno {state.write.seqno}, RBA {state.write.rba}, "
             f"last CSN {state.last_csn or 'none'}"]
    if showch is None:
        return "\n".join(lines + ["", _TIMES])
    lines += ["", "Current Checkpoint Detail:", "", "Read Checkpoint #1", "", "    Trail (EXTTRAILSOURCE)",
              "    Current Checkpoint (position of last record read in the source trail):",
              f"        Sequence #: {state.read.seqno}", f"        RBA: {state.read.rba}",
              f"        Extract Trail: {state.exttrail}",
              "", "Write Checkpoint #1", "", "    Trail (RMTTRAIL)", "    Current Checkpoint (current write position):",
              f"        Sequence #: {state.write.seqno}", f"        RBA: {state.write.rba}",
              f"        Timestamp: {utc(state.updated_at)}", f"        Last CSN: {state.last_csn or 'none'}",
              f"        Remote Trail: {state.rmttrail}",
              "", "    Status:", f"        Table filter = {state.table_spec or 'none (PASSTHRU)'}",
              f"        Start Time = {utc(state.last_started)}",
              f"        Last Update Time = {utc(state.last_run_end)}"]
    for run in runs:
        c = run["checkpoints"]
        lines += ["", f"Checkpoint history: run {run['run_id']} ended {utc(run['ended_at'])}, "
                      f"{run['files_read']} file(s) read ({run['records_read']} records), {run['files_written']} "
                      f"written ({run['records_written']} records)",
                  f"    Read: Seqno:RBA {c['read']}; Write: Seqno:RBA {c['write']} last CSN {c['last_csn']}"]
    return "\n".join(lines + ["", _TIMES])
