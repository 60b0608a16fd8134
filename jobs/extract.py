"""spark-submit entry point: one capture (Extract) batch.

    spark-submit jobs/extract.py EXT1 [--until 2026-11-01T04:00:00Z]

Same as `trailbound extract run EXT1`; the master comes from spark-submit.
"""

import sys

from trailbound.cli import main

if __name__ == "__main__":
    sys.exit(main(["extract", "run", *sys.argv[1:]]))
