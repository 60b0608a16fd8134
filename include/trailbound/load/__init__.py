"""Initial load: copying a live PostgreSQL source's existing rows into the target on Spark,
and handing over to replicat with nothing lost and nothing applied twice
(docs/initial-load.md).

    copy.py      one Spark task per key-range chunk: COPY out of the source, COPY into the
                 target (the rows never pass through the driver)
    progress.py  the load's progress as it writes it to the metadata store (resume)
    run.py       `trailbound load`: at the slot's exported snapshot, or between watermarks

Replicat's side of a load lives in replicat: `replicat/windows.py` applies a watermark
load's chunks at their high watermarks (and names the watermark and window tables),
`replicat/loadinfo.py` reads a load's progress back (`info replicat`, and this
package). Who may import what: the load imports replicat, never the other way round;
`run.py` talks to the source as `sources/postgres/` does and is imported only by
`cli/load.py`; `copy.py` and `progress.py` import nothing from `sources/`. Key ranges
(planned, and as SQL conditions) are the engine's keyranges.py, shared with the compare.
"""
