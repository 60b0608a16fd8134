"""Errors a user acts on. Each names what to look at: a file and position, a config key."""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator


class TrailboundError(Exception):
    """Base of every error the command line prints without a traceback."""


class ArchiveError(TrailboundError):
    """The redo archive breaks its contract. Names the file and, for a record, its rba."""

    def __init__(self, path: str, message: str, rba: int | None = None):
        self.path = str(path)
        self.rba = rba
        self.message = message
        where = self.path if rba is None else f"{self.path} rba {rba}"
        super().__init__(f"{where}: {message}")


def changed_since_added(group: str, added: str, now: str, remedy: str) -> TrailboundError:
    """A group's configuration no longer says what the group was added with (its trail,
    source or checkpoint table): refused, since its checkpoints belong to the old one.
    `group` is e.g. "pump PMP1"; `remedy` what the user may do instead of restoring."""
    return TrailboundError(f"{group} was added {added}; the configuration now says {now}. Restore the "
                           f"configuration, or {remedy}")


class ConfigError(TrailboundError):
    """The configuration file is invalid. Names the file and the key."""


class TrailError(TrailboundError):
    """A trail file that is not what its metadata says. Names the file (and rba)."""

    def __init__(self, path, message: str, rba: int | None = None):
        where = f"{path}" if rba is None else f"{path} rba {rba}"
        super().__init__(f"{where}: {message}")
        self.path, self.rba = str(path), rba


# How a TrailboundError raised in a Spark task ends the worker's traceback, which is the
# text of the PythonException that brings it to the driver.
_RAISED_IN_A_TASK = re.compile(r"^trailbound\.errors\.[A-Za-z]+: (.+)$", re.MULTILINE)


def raised_in_a_spark_task(exc: BaseException) -> TrailboundError | None:
    """The TrailboundError a Spark task raised (a segment that cannot be read, named with
    its path), out of the PythonException that carries it to the driver as a worker's
    traceback; None for any other exception. The command line then prints the same one
    ERROR line as for the error raised on the driver, not two stack traces."""
    # A PythonException; or, when the failed job ran on another thread of the driver (a
    # broadcast, a subquery), the Py4JJavaError of the ExecutionException that wraps it.
    if type(exc).__name__ != "PythonException" and "org.apache.spark.api.python.PythonException" not in str(exc):
        return None
    found = _RAISED_IN_A_TASK.findall(str(exc))
    return TrailboundError(found[-1]) if found else None


@contextmanager
def spark_task_errors_as_ours() -> Iterator[None]:
    """Raise the TrailboundError a Spark task raised in place of the PythonException that
    carries it: the command line and the Airflow tasks that run the engine in their
    worker (compare, load, the replica check) then report the same one line, naming the
    file and position, as for an error raised on the driver."""
    try:
        yield
    except Exception as exc:
        in_a_task = raised_in_a_spark_task(exc)
        if in_a_task is None:
            raise
        raise in_a_task from None
