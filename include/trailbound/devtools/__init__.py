"""Development tools: helpers for the demo, the Makefile and the test suite, never the product.

`localpg.py` starts a throwaway local PostgreSQL (`python -m trailbound.devtools.localpg`).
Nothing in the engine imports this package; the Makefile and tests/conftest.py do.
"""
