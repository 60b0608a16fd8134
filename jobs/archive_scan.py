"""spark-submit entry point: catalog new redo segments after checking them.

    spark-submit jobs/archive_scan.py [--source NAME]

Same as `trailbound archive scan`; the master comes from spark-submit.
"""

import sys

from trailbound.cli import main

if __name__ == "__main__":
    sys.exit(main(["archive", "scan", *sys.argv[1:]]))
