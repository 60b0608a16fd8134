"""spark-submit entry point: an initial load (docs/initial-load.md).

    spark-submit jobs/load.py SRC REP1 [--table PATTERN] [--chunk-rows N] [--mode snapshot|watermark]

Same as `trailbound load SRC REP1 ...`; the master comes from spark-submit. Its progress
lines go to the job's output (the Airflow task log when a task submits it).
"""

import sys

from trailbound.cli import main

if __name__ == "__main__":
    sys.exit(main(["load", *sys.argv[1:]]))
