"""Replicat: apply a trail to PostgreSQL exactly once through a checkpoint table.

`run.py` is one run; `netchange.py` the Spark transform it uses; `apply.py` the target
side (staging, merge, record-by-record replay); `checkpoint_table.py` the target's
checkpoint table; `checkpoints.py` the metadata store's side; `target.py` the target's
catalog and table mapping; `info.py` INFO REPLICAT. See docs/replicat.md.
"""
