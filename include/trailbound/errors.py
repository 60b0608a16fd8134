"""Errors a user acts on. Each names what to look at: a file and position, a config key."""

from __future__ import annotations


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
