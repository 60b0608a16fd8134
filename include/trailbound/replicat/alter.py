"""ALTER REPLICAT group atcsn N | aftercsn N | extseqno S [extrba R]: reposition a replicat.

The new position goes to the checkpoint table in the target and to the file checkpoint
in the metadata store, under the group's lock; the next run starts there.
"""

from __future__ import annotations

from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.metadata import MetadataStore
from trailbound.positions import Csn, TrailPosition
from trailbound.replicat import checkpoint_table as ckt
from trailbound.replicat import checkpoints as ckpt
from trailbound.replicat import target as tgt
from trailbound.replicat.run import ensure_group, group_lock, hold_target, release_target
from trailbound.trail import catalog

_MAX_BIGINT = 2 ** 63 - 1


def _just_below(csn: Csn) -> Csn:
    """The greatest CSN below `csn`: "applied up to here" for `atcsn csn`."""
    if csn.rba:
        return Csn(csn.scn, csn.thread, csn.sequence, csn.rba - 1)
    if csn.sequence:
        return Csn(csn.scn, csn.thread, csn.sequence - 1, _MAX_BIGINT)
    if csn.thread:
        return Csn(csn.scn, csn.thread - 1, _MAX_BIGINT, _MAX_BIGINT)
    return Csn(csn.scn - 1, _MAX_BIGINT, _MAX_BIGINT, _MAX_BIGINT) if csn.scn else csn


def csn_bound(how: str, text: str) -> Csn:
    """log_csn for `atcsn N` / `aftercsn N`: every transaction at or below it counts as
    applied. A bare commit SCN N means every commit at that SCN (Csn.parse sorts N before
    them all, and N+1 after them all)."""
    csn = Csn.parse(text)
    bare = "@" not in text
    if how == "atcsn":
        return csn if bare else _just_below(csn)
    return Csn(csn.scn + 1) if bare else csn


def reposition(store: MetadataStore, config: Config, group: str, words: list[str], *,
               target_dsn: str | None = None) -> str:
    """ALTER REPLICAT group atcsn N | aftercsn N | extseqno S [extrba R]: writes the new
    position to the checkpoint table and the file checkpoint (the next run starts there).
    extseqno keeps log_csn, so transactions already applied are still skipped."""
    usage = "usage: trailbound alter replicat GROUP atcsn N | aftercsn N | extseqno S [extrba R]"
    lowered = [w.lower() for w in words]
    name = config.replicat_name(group)
    with group_lock(store, name):
        state = ensure_group(store, config, name, adopt=lowered[:1] == ["extseqno"])
        if len(words) == 2 and lowered[0] in ("atcsn", "aftercsn"):
            try:
                bound = csn_bound(lowered[0], words[1])
            except ValueError as exc:
                raise TrailboundError(f"{exc}; {usage}") from None
            with store.transaction() as cur:
                position = catalog.position_after(cur, state.exttrail, bound)
            log_csn, keep_log_csn = bound, False
            what = f"{lowered[0]} {words[1]}: transactions at or below CSN {bound} count as applied"
        elif lowered[:1] == ["extseqno"] and len(words) in (2, 4) and (len(words) == 2 or lowered[2] == "extrba"):
            try:
                position = TrailPosition(int(words[1]), int(words[3]) if len(words) == 4 else 0)
            except ValueError:
                raise TrailboundError(usage) from None
            if position.seqno < 0 or position.rba < 0:
                raise TrailboundError(usage)
            # extseqno moves the position only: transactions already applied stay skipped.
            log_csn, keep_log_csn = None, True
            what = f"extseqno {position.seqno} extrba {position.rba}"
        else:
            raise TrailboundError(usage)
        table_name = ckt.CheckpointTableName.parse(state.checkpoint_table)
        connection = tgt.connect(config, target_dsn)
        try:
            hold_target(connection, name)
            with connection.cursor() as cur:
                ckt.create(cur, table_name)
                ckt.set_position(cur, table_name, name, position, log_csn=log_csn, keep_log_csn=keep_log_csn,
                                 current_dir=str(config.home))
                row = ckt.read(cur, table_name, name)
            connection.commit()
        finally:
            release_target(connection, name)
        checkpoint = ckpt.Checkpoint(row.position, row.log_csn, row.log_bsn, row.audit_ts)
        with store.transaction() as cur:
            ckpt.save(cur, state, checkpoint)
            ckpt.mark_altered(cur, state)
    return (f"REPLICAT {name} altered, {what}; the next run reads trail {state.exttrail} from seqno "
            f"{position.seqno} rba {position.rba} (log_csn {checkpoint.log_csn or 'none'})")
