"""Development tools: helpers for the demo, the Makefile and the test suite, never the product.

`localpg.py` starts a throwaway local PostgreSQL (`python -m trailbound.devtools.localpg`);
`sparkconnect.py` starts a local Spark Connect server, the Spark that outlives the runs
(`python -m trailbound.devtools.sparkconnect`); `livedemo.py` is `make demo-live`: the
pipeline on a live PostgreSQL source, through Airflow; `soak.py` is `make soak`: that
pipeline under Airflow's scheduler for a while, with faults.
Nothing in the engine imports this package; the Makefile and tests/conftest.py do.
"""
