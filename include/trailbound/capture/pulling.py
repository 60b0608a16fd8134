"""`extract run G --pull`: capture while the extract's PostgreSQL source is being pulled.

`archive pull` of the source runs in a child process (`python -m trailbound.cli`), and
capture runs here at the same time: a round over what the archive holds whenever the
last one ends, and one more once the pull has ended. The rounds keep Spark's JVM busy
(and warm) while the WAL is still being read, instead of starting it cold after the
pull; each round is an ordinary run over complete segments (the pull writes the
manifest last), so the trail is what a pull then a run would write.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from trailbound.capture.run import RunResult, run_extract
from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.metadata import MetadataStore


@dataclass
class PulledRun:
    """The pull's own report, how long it took, and the capture rounds run beside it."""

    source: str
    pulled: str
    seconds: float
    rounds: list[RunResult]
    returncode: int
    errors: str

    def describe(self) -> str:
        lines = [f"{self.pulled}; pulled in {self.seconds:.1f} s, beside {len(self.rounds) - 1} capture round(s)"]
        for result in [r for r in self.rounds[:-1] if not r.note] + self.rounds[-1:]:
            lines.append(result.describe())
        return "\n".join(lines)

    def check(self) -> None:
        """The pull's failure, in its own last ERROR line, once the rounds are reported."""
        if self.returncode:
            failed = [line.removeprefix("ERROR ") for line in self.errors.splitlines() if line.startswith("ERROR ")]
            reason = failed[-1] if failed else f"exit status {self.returncode}: {self.errors.strip()[-500:]}"
            raise TrailboundError(f"archive pull {self.source}: {reason}")


def run_extract_pulling(spark: Callable[[], object], store: MetadataStore, config: Config, group: str, *,
                        config_file: str | None = None, until: datetime | None = None,
                        brreset: bool = False) -> PulledRun:
    """Pull the group's source in a child process and capture meanwhile (see above).
    `spark` is called for the first round only, after the child has started, so the pull
    and the JVM's start overlap; `config_file` is passed on to the child (else its
    environment names the configuration)."""
    if until:
        raise TrailboundError("--pull reads the source up to now: it cannot be given with --until (a past interval "
                              "is captured from what is archived already)")
    name = config.extract_name(group)
    source = config.source_name(config.extract(name).source)
    config.postgres(source)  # a ConfigError unless the source is a PostgreSQL database
    options = ["--config", str(config_file)] if config_file else []
    # The child's output goes to files, not pipes: nothing reads it until the end.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        pulling = subprocess.Popen([sys.executable, "-m", "trailbound.cli", *options, "archive", "pull", source],
                                   stdout=out, stderr=err, text=True)
        ended: list[float] = []  # when the pull ended, noted by a thread that waits for it
        waiter = threading.Thread(target=lambda: (pulling.wait(), ended.append(time.monotonic())), daemon=True)
        waiter.start()
        rounds: list[RunResult] = []
        try:
            while True:
                pull_ended = bool(ended)
                rounds.append(run_extract(spark(), store, config, name, brreset=brreset))
                brreset = False  # one normal recovery: the first round's
                if pull_ended:
                    break
                if rounds[-1].note:  # nothing new archived yet
                    waiter.join(timeout=0.5)
        except BaseException:
            pulling.kill()
            waiter.join()
            raise
        out.seek(0)
        err.seek(0)
        pulled, errors = out.read().strip(), err.read()
    return PulledRun(source, pulled, ended[0] - started, rounds, pulling.returncode, errors)
