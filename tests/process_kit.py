"""Stopping the servers a test started (Airflow's scheduler, API server, triggerer; a
Spark master and worker), each in a process group of its own."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_process_groups(processes: list[subprocess.Popen], grace: float = 60) -> None:
    """SIGTERM to every group, then up to `grace` seconds for each leader to exit; what is
    still running after that (a leader that did not exit, or children it left) is killed.
    A server that is slow to shut down is not what a test asserts (an Airflow scheduler
    once took over a minute to exit in CI, its runs done): a test must neither fail there
    nor leave it running for the next one."""
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:  # the group has no process left
        pass
