"""Replicat: apply a trail to PostgreSQL exactly once through a checkpoint table.

`run.py` is one run; `chunks.py` plans a chunk of trail records (transactions, groups,
units, what is already applied); `netrows.py` turns a chunk into COPY lines, through
`netarrow.py` (vectorised, where no key changes), `netpython.py` (plain Python, for the
few records with a key-changing update) and `netchange.py` (the Spark transform, for many);
`apply.py` the target side (staging, merge, record-by-record replay); `parallel.py`
insert-only groups on several target sessions, committed in trail order; `copychain.py`
a parallel session's group as one query (its COPYs chained, the commit on the last);
`checkpoint_table.py` the target's checkpoint table; `checkpoints.py` the metadata
store's side; `alter.py` ALTER REPLICAT; `target.py` the target's catalog and table
mapping; `info.py` INFO REPLICAT; `expected.py` what a replica should hold. See
docs/replicat.md.

Replicat reads trails only through `trailbound.trail`. The command line, the Airflow
plugin, `quality.py` and tests import it; capture, pump and retention never do.
"""
