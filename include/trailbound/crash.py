"""Named crash points: where a test may kill a job as `kill -9` would, or hold it still.

A job calls `crashpoint("after_trail_write")` at each step whose interruption must be
survivable; with TRAILBOUND_CRASH_AT naming that step the process exits at once (status
137, no cleanup, no atexit), which is what the crash tests need to prove that a re-run
converges. With TRAILBOUND_PAUSE_AT=`step=FILE` the process instead creates FILE the first
time it reaches that step and waits while the file exists: a test restarts a server under
a job caught mid-step, then lets it go on (tests/test_restarts.py). Unset, a crash point
costs two environment lookups.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CRASH_ENV = "TRAILBOUND_CRASH_AT"
PAUSE_ENV = "TRAILBOUND_PAUSE_AT"
_paused: set[str] = set()  # steps already held once in this process


def crashpoint(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(137)
    step, _, flag = os.environ.get(PAUSE_ENV, "").partition("=")
    if step == name and name not in _paused:
        _paused.add(name)
        flag = Path(flag)
        flag.touch()
        while flag.exists():
            time.sleep(0.05)
