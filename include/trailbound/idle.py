"""Is there anything for a run to do? The cheap checks made before starting Spark.

A scheduled capture, pump or replicat run with nothing new still paid for spark-submit,
a JVM and a SparkSession (most of a minute on a busy machine) only to find out. Each
function here answers from the metadata store (and the archive directory's manifests,
or the target's checkpoint table) without Spark or pyspark, with the very condition the
run itself would stop on: it returns why there is nothing to do, or None when the run
must go ahead. Whenever it cannot tell (a group not added yet, a configuration that
differs from the registered one, an error reading anything), it says None and lets the
run decide and report.

What a skipped run does not do: record that it started (INFO shows the last real run),
and for pump remove a remote file left uncommitted by a crash (the next real run does).
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime

from trailbound.config import Config
from trailbound.metadata import MetadataStore

log = logging.getLogger("trailbound.idle")


def _run_when_unsure(kind: str):
    """Any doubt (an error while checking) means: run. The check only saves a Spark start."""
    def decorate(check):
        @functools.wraps(check)
        def checked(store, config, group, *args, **kwargs):
            try:
                return check(store, config, group, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - any doubt: run
                log.info("%s %s: cannot tell whether there is work (%s); running", kind, group,
                         " ".join(str(exc).split()) or type(exc).__name__)
                return None
        return checked
    return decorate


@_run_when_unsure("extract")
def capture_idle(store: MetadataStore, config: Config, group: str, until: datetime | None) -> str | None:
    """Nothing to capture: no segment waits in the archive directory to be cataloged (or
    restored), and the catalog's horizon by `until` is not past the group's read SCN, the
    condition `run_extract` returns early on after its scan."""
    from trailbound.archive.catalog import ArchiveCatalog
    from trailbound.capture import checkpoints as ckpt

    name = config.extract_name(group)
    source = config.source_name(config.extract(name).source)
    archive_dir = config.archive_dir(source)
    catalog = ArchiveCatalog(store, source)
    if catalog.pending(archive_dir) or catalog.restorable(archive_dir):
        return None
    with store.transaction() as cur:
        state = ckpt.load(cur, name)
    if state is None or state.read_scn is None:
        return None
    horizon = catalog.horizon(until)
    if horizon is not None and horizon.scn > state.read_scn:
        return None
    return (f"extract {name}: nothing new below the horizon (read SCN {state.read_scn}"
            f"{f', archived by {until.isoformat()}' if until else ''}); Spark not started")


@_run_when_unsure("pump")
def pump_idle(store: MetadataStore, config: Config, group: str) -> str | None:
    """Nothing to ship: no committed source trail file after the pump's read position."""
    from trailbound.pump import checkpoints as pck
    from trailbound.pump.run import _pending_files

    name = config.pump_name(group)
    pump = config.pump(name)
    with store.transaction() as cur:
        state = pck.load(cur, name)
        if state is None or (state.exttrail, state.rmttrail) != (config.trail_location(pump.exttrail),
                                                                 config.trail_location(pump.rmttrail)):
            return None
        if _pending_files(cur, state):
            return None
    return f"pump {name}: nothing new in {state.exttrail} after seqno {state.next_source_seqno() - 1}; " \
           "Spark not started"


@_run_when_unsure("replicat")
def replicat_idle(store: MetadataStore, config: Config, group: str, target_dsn: str | None = None) -> str | None:
    """Nothing to apply: no committed trail file after the group's position, read as the
    run reads it (the target's checkpoint table row wins over the file checkpoint: a
    restored target must be caught up even when the file checkpoint says done)."""
    from trailbound.replicat import checkpoint_table as ckt
    from trailbound.replicat import checkpoints as ckpt
    from trailbound.replicat import target as tgt
    from trailbound.replicat.run import pending_files

    name = config.replicat_name(group)
    replicat = config.replicat(name)
    with store.transaction() as cur:
        state = ckpt.load(cur, name)
    if state is None or (state.exttrail, state.checkpoint_table) != (
            config.trail_location(replicat.exttrail), str(ckt.CheckpointTableName.parse(replicat.checkpointtable))):
        return None
    connection = tgt.connect(config, target_dsn)
    try:
        with connection.cursor() as cur:
            row = ckt.read(cur, ckt.CheckpointTableName.parse(state.checkpoint_table), name)
    finally:
        connection.close()
    position = row.position if row is not None else state.checkpoint.position
    with store.transaction() as cur:
        files, _ = pending_files(cur, state, position)
    if files:
        return None
    return f"replicat {name}: nothing new in {state.exttrail} after seqno {position.seqno} rba {position.rba}; " \
           "Spark not started"
