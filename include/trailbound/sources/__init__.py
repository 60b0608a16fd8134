"""Sources: everything that writes the redo archive (docs/redo-archive.md).

A source stands outside the engine: it writes segments, manifests and defs.json through
`trailbound.archive.writer` and the contract in `trailbound.archive.contract`, and the
engine reads only what it wrote. `simulator.py` is the simulated source (the demo, the
tests, the benchmarks). Sources may import `trailbound.archive`, `trailbound.errors` and
`trailbound.positions`; nothing in the engine (capture, trail, pump, replicat, retention)
imports a source — only the command line (`trailbound simulate`) and tests do.
"""
