"""spark-submit entry point: one pump run (trail shipping).

    spark-submit jobs/pump.py PMP1

Same as `trailbound pump run PMP1`; the master comes from spark-submit. The session's
Hadoop configuration (`--conf spark.hadoop.fs.s3a....`) is what reaches a remote trail.
"""

import sys

from trailbound.cli import main

if __name__ == "__main__":
    sys.exit(main(["pump", "run", *sys.argv[1:]]))
