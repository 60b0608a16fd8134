"""`python -m trailbound.cli ...`: the `trailbound` command."""

import sys

from trailbound.cli import main

sys.exit(main())
