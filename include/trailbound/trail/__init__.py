"""The trail: committed transactions in commit order, in files, between capture, pump and replicat.

- `format.py`  the trail file format: write, read and verify one file (docs/trail-format.md).
- `fs.py`      where trail files live: a local path or a Hadoop-compatible URI.
- `catalog.py` the metadata store's side: committed files (trail_file) and reader
               positions (trail_reader), and the pending-files check readers share.
- `purge.py`   PURGEOLDEXTRACTS ... USECHECKPOINTS: delete files every reader has passed.

Writers (capture, pump) and readers (pump, replicat, INFO, the DAGs' checks) import these
modules; they import only `trailbound.errors`, `positions`, `config` and `metadata`,
never capture, pump or replicat. `fs.py` needs no pyarrow (the configuration uses it).
"""


def __getattr__(name: str):
    # Transitional: `from trailbound.trail import BEGIN` and `trail.read_file` (capture/assemble.py,
    # quality.py) still name the format module's contents here; new code imports trail.format.
    import importlib

    if name.startswith("__") or name in ("format", "fs", "catalog", "purge"):
        raise AttributeError(f"module 'trailbound.trail' has no attribute {name!r}")
    try:
        return getattr(importlib.import_module("trailbound.trail.format"), name)
    except AttributeError:
        raise AttributeError(f"module 'trailbound.trail' has no attribute {name!r}") from None
