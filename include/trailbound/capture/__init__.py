"""Capture (Extract): read the redo archive, assemble transactions, write the trail in
commit order, and commit the checkpoints.

`run.py` is one run; `pulling.py` `extract run --pull` (capture rounds beside a pull of
the PostgreSQL source); `logread.py` the log read by Spark tasks with pyarrow
(per-transaction summaries, the trail's records); `assemble.py` the Spark transform (group
by transaction, resolve savepoints, order by CSN, transaction indicators); `onetask.py` a run's
trail written by one task, no shuffle, when no transaction is skipped, forced or persisted
(the log read twice: transactions' fates and commit order, then the records in it); `trailwrite.py`
the trail written by Spark tasks and verified before the commit; `recovery.py` the recovery rules
(restart point, required SCN, the Bounded Recovery plan) that the run, INFO and
retention share; `bounded.py` Bounded Recovery's persisted files; `checkpoints.py` the
metadata store's side (read, write and BR checkpoints, open transactions, run history);
`begin.py` BEGIN points; `directives.py` SKIPTRANS/FORCETRANS/BRRESET; `info.py` INFO
EXTRACT and SHOWTRANS. See docs/capture.md and docs/bounded-recovery.md.

Capture reads the archive through `trailbound.archive` and writes trails through
`trailbound.trail`; it never imports pump, replicat or a source. The command line, the
jobs, retention (`recovery`, `checkpoints`), `quality.py` and tests import it.
"""
