"""The trail: committed transactions in commit order, in files, between capture, pump and replicat.

- `format.py`  the trail file format: write, read and verify one file (docs/trail-format.md).
- `catalog.py` the metadata store's side: committed files (trail_file) and reader
               positions (trail_reader), and the pending-files check readers share.
- `purge.py`   PURGEOLDEXTRACTS ... USECHECKPOINTS: delete files every reader has passed.

Writers (capture, pump) and readers (pump, replicat, INFO, the DAGs' checks) import these
modules; they import only `trailbound.errors`, `positions`, `config` and `metadata`,
never capture, pump or replicat. `trailbound.files` needs no pyarrow at import (the configuration uses it).
"""

