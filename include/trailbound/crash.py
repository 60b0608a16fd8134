"""Named crash points: where a test may kill a job as `kill -9` would.

A job calls `crashpoint("after_trail_write")` at each step whose interruption must be
survivable; with TRAILBOUND_CRASH_AT naming that step the process exits at once (status
137, no cleanup, no atexit), which is what the crash tests need to prove that a re-run
converges. Unset, a crash point costs one environment lookup.
"""

from __future__ import annotations

import os

CRASH_ENV = "TRAILBOUND_CRASH_AT"


def crashpoint(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(137)
