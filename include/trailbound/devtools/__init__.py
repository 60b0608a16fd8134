"""Development tools: helpers for the demo, the Makefile and the test suite, never the product.

`localpg.py` starts a throwaway local PostgreSQL (`python -m trailbound.devtools.localpg`);
`livedemo.py` is `make demo-live`: the pipeline on a live PostgreSQL source, through Airflow.
Nothing in the engine imports this package; the Makefile and tests/conftest.py do.
"""
