"""Sources: everything that writes the redo archive (docs/redo-archive.md).

A source stands outside the engine: it turns one kind of database log into segments,
manifests and defs.json of the fixed contract through `trailbound.archive.writer`, so
capture, Bounded Recovery, pump, replicat and retention work the same whatever wrote the
archive. `simulator/` is the simulated source (the demo, the tests, the benchmarks);
`postgres/` is the PostgreSQL log miner (a logical replication slot, pgoutput). Sources
may import `trailbound.archive`, `config`, `crash`, `durable`, `errors`, `metadata` and
`positions`; nothing in the engine (capture, trail, pump, replicat, retention) imports a
source, only the command line and tests do.
"""
