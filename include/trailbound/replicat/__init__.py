"""Replicat: apply a trail to PostgreSQL exactly once through a checkpoint table.

`run.py` is one run; `chunks.py` plans a chunk of trail records (transactions, groups,
units, what is already applied); `net/` turns a chunk into COPY lines (its `__init__`
states the net-row contract; `arrow.py`, `python.py`, `spark.py` the backends, `rows.py`
the lines indexed, `compute.py` a chunk's lines); `apply/` the target side (its
`__init__` states the apply contract; `serial.py` staging, merge, record-by-record
replay, `parallel.py` insert-only groups on several sessions, `copychain.py` a session's
group as one query); `windows.py` a watermark load's windows, applied in the trail's
commit order; `heartbeat.py` the heartbeat records written into the target's heartbeat
tables with the checkpoint row (docs/heartbeat.md); `loadinfo.py` a load's progress read back (INFO REPLICAT);
`ddl.py` a source table's new version on the target (added columns, widened types,
new tables, or a stop before the first row); `reperror.py` REPERROR, what a refused
operation does (abend, discard, ignore, retryop, transabend, transdiscard);
`discards.py` the discard table in the target and each run's discard file; `reapply.py`
discarded operations applied again; `checkpoint_table.py` the target's
checkpoint table; `checkpoints.py` the metadata
store's side; `alter.py` ALTER REPLICAT; `target.py` the target's catalog and table
mapping; `info.py` INFO REPLICAT; `expected.py` what a replica should hold. See
docs/replicat.md.

Replicat reads trails only through `trailbound.trail`, and never imports `trailbound.load`
(the load imports replicat: `windows.py`, `loadinfo.py`, `target.py`, `alter.py`). The
command line, the Airflow plugin, `quality.py` and tests import it; capture, pump and
retention never do.
"""
