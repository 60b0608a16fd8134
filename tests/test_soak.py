"""The soak's short version (`make soak` runs 30 minutes: docs/benchmarks/soak.md).

The live pipeline run by Airflow's own scheduler and API server (not `airflow dags test`)
while pgbench writes, with one fault of each kind: kill -9 of a running task, kill -9 of
the scheduler, `pg_ctl restart -m fast` of the source and of the metadata
store and target server, kill -9 of the Spark Connect server the tasks run their Spark
work on. Afterwards the target equals the source table by table (a
duplicate or a lost pgbench_history row changes its count), the checkpoint row is at the
archive's last COMMIT, the slot was never confirmed past the archive, and the lag came
back under its bound after each fault.

Lighter than `make soak` where that changes no check (docs/benchmarks/test-suite.md):
each kind of fault exactly once, one every ~12 s, then pgbench stops (--minutes 0); pgbench
at 10 tps over 1,000 accounts (the first backlog is the data load: pgbench's own is
100,000 rows through capture, validation and replicat, the costliest part of the run); no
triggerer (`--no-triggerer`: none of the soak's DAGs defers a task; the console UI test is
the triggerer's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.pg
@pytest.mark.long_running(420)
def test_a_short_soak_with_each_fault_converges_with_nothing_lost_or_duplicated(tmp_path):
    report = tmp_path / "soak.md"
    # The servers run as `postgres`, which cannot enter pytest's tmp_path (root's, 0700).
    home = REPO / "var" / "test-soak" / str(os.getpid())
    try:
        done = _soak(home, report)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    output = done.stdout + done.stderr
    assert report.exists(), output[-4000:]
    text = report.read_text()
    assert "| divergences / duplicates / losses | 0 / 0 / 0 |" in text, text
    assert "| tables equal to the source at the end | yes" in text, text
    kinds = [line.split("|")[2].strip() for line in text.splitlines() if line.startswith("| ") and
             line.split("|")[2].strip() in ("task", "scheduler", "source", "target", "spark")]
    assert sorted(set(kinds)) == ["scheduler", "source", "spark", "target", "task"], text
    assert "nothing killed" not in text, text
    assert done.returncode == 0, output[-4000:]
    assert (tmp_path / "soak.png").stat().st_size > 10_000, "the lag curve was drawn"


def _soak(home: Path, report: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trailbound.devtools.soak", "--minutes", "0", "--interval", "30",
         "--fault-every", "12", "--faults", "task,scheduler,source,target,spark", "--rate", "10",
         "--accounts", "1000", "--no-triggerer", "--seed", "7", "--home", str(home), "--report", str(report)],
        capture_output=True, text=True, timeout=1800)
