"""Pump (GoldenGate's data pump): ship the committed files of a trail to a remote trail.

- `checkpoints.py` the pump's state in the metadata store: ADD / DELETE, its read and
                   write checkpoints, each shipped file's commit, the run history.
- `filter.py`      the TABLE filter: a trail file's records of the selected tables.
- `run.py`         one run: ship, verify, rename into place, commit, file by file.
- `info.py`        INFO PUMP [SHOWCH].

The pump reads and writes trails only through `trailbound.trail` (format, catalog) and
`trailbound.files`, the one file-system layer.
The command line, the DAGs' tasks and tests import it; capture and replicat never do.
See docs/pump.md.
"""
