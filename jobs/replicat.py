"""spark-submit entry point: one replicat run (apply the trail to the target).

    spark-submit jobs/replicat.py REP1

Same as `trailbound replicat run REP1`; the master comes from spark-submit.
"""

import sys

from trailbound.cli import main

if __name__ == "__main__":
    sys.exit(main(["replicat", "run", *sys.argv[1:]]))
