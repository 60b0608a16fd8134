"""Compare: a Veridata-style check that a PostgreSQL source's tables and their replicat
targets hold the same rows (`trailbound compare SRC REP1`, docs/compare.md).

    sides.py     the SQL run on either side: session settings, a range's digest, its rows,
                 rows by key; the one Spark task per range (check_range)
    confirm.py   how far the replicat has applied (an LSN), and the confirm-out-of-sync step
    run.py       one compare: plan, Spark round, confirm, results, the metadata store, report files
    repair.py    the repair script: SQL that brings the target in line with the source

The command line, `quality.py` (the replica check of a live source) and the Airflow
plugin import this package; no other engine package does. It reads the source database
directly (plain SELECTs, no locks); it imports nothing from trailbound.sources: run.py plans
key ranges with the planner it shares with the initial load (keyranges.py, at the engine's top level).
"""
