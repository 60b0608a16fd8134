"""Initial load: copying a live PostgreSQL source's existing rows into the target on Spark,
and handing over to replicat with nothing lost and nothing applied twice
(docs/initial-load.md).

    keys.py      a key range as a SQL condition, typed by the table's own row type
    copy.py      one Spark task per key-range chunk: COPY out of the source, COPY into the
                 target (the rows never pass through the driver)
    progress.py  the load's progress in the metadata store (resume, `info replicat`)
    windows.py   replicat's side of a watermark load: a chunk's rows applied at its high
                 watermark's place in commit order, minus the keys the log changed
    run.py       `trailbound load`: at the slot's exported snapshot, or between watermarks

Who may import what: `run.py` talks to the source as `sources/postgres/` does and is
imported only by `cli/load.py`. `windows.py`, `keys.py` and `progress.py` import nothing
from `sources/`; replicat (run.py, chunks.py, info.py) imports them.
"""
