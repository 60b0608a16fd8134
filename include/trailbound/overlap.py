"""`trailbound replicate SRC`: one source's stages at once instead of one after another.

Each stage of the source's pipeline (the pull of a PostgreSQL source, every extract
reading the source, every pump shipping their trails, every replicat applying what
they write) runs in a process of its own: `python -m trailbound.cli ... run GROUP
--loop`, which runs the stage again and again, each time an ordinary run with its own
group lock, checkpoints and recorded outcome (so crash safety is exactly a single
run's), and waits `poll` seconds whenever `idle.py` says there is nothing for it to do.
Capture therefore works on the segments the pull has finished while the pull goes on
(capture's horizon is the archive's durable end), pump ships the trail files capture
has committed, replicat applies what pump has shipped. Separate processes, not
threads: a capture process keeps its one Spark session (and its JVM) across its runs,
and no Spark session is shared between threads.

The supervisor (`replicate`) relays the stages' lines, and stops them all:
- caught up (the default): the source's end as it was at the start has been applied. A
  PostgreSQL source is pulled once (a pull reads the slot up to the server's WAL position
  at its start); the simulator's archive is taken as it is. Then, checked upstream
  first, every stage has nothing to do: capture has read the whole archive, then every
  pump has shipped every trail file committed by then, then every replicat has applied
  every file shipped by then. Each check is made after the one before it, so together
  they say that everything the archive held reached the target.
- `follow`: the pull loops too, and the command runs until interrupted.
- a stage that fails (or is killed): the others are told to stop, each after its run in
  progress, and the failure is one line naming the stage.
Stopping is SIGTERM to a loop: it ends once the run in progress has committed. An
interrupt (Ctrl-C) stops the same way; a second one kills the stages outright (still
crash-safe: each run's checkpoints commit atomically).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trailbound import idle
from trailbound.config import Config
from trailbound.errors import TrailboundError
from trailbound.metadata import MetadataStore

NOUNS = {"pull": "pull", "extract": "capture", "pump": "pump", "replicat": "replicat"}


@dataclass(frozen=True)
class Stage:
    """One loop of the pipeline: `kind` pull|extract|pump|replicat, of `group` (the
    source's name for the pull)."""

    kind: str
    group: str

    def __str__(self) -> str:
        return f"{NOUNS[self.kind]} {self.group}"

    def words(self, *, loop: bool, poll: float) -> list[str]:
        verb = ["archive", "pull"] if self.kind == "pull" else [self.kind, "run"]
        return [*verb, self.group, *(["--loop", "--poll", str(poll)] if loop else [])]


def pipeline(config: Config, source: str) -> list[Stage]:
    """The source's stages, upstream first: its pull (a PostgreSQL source), the extracts
    reading it, the pumps reading their trails, the replicats reading either."""
    source = config.source_name(source)
    stages = [Stage("pull", source)] if config.source(source).postgres else []
    extracts = [name for name, e in config.extracts.items() if e.source.upper() == source.upper()]
    if not extracts:
        raise TrailboundError(f"no extract in the configuration reads source {source}: nothing to replicate")
    trails = {config.trail_location(config.extracts[name].exttrail) for name in extracts}
    pumps = [name for name, p in config.pumps.items() if config.trail_location(p.exttrail) in trails]
    shipped = trails | {config.trail_location(config.pumps[name].rmttrail) for name in pumps}
    replicats = [name for name, r in config.replicats.items() if config.trail_location(r.exttrail) in shipped]
    if not replicats:
        raise TrailboundError(f"no replicat in the configuration applies a trail of source {source}'s extracts "
                              f"({', '.join(extracts)}) or of their pumps: nothing would reach the target")
    return (stages + [Stage("extract", n) for n in extracts] + [Stage("pump", n) for n in pumps]
            + [Stage("replicat", n) for n in replicats])


def idle_check(kind: str, store: MetadataStore, config: Config, group: str,
               target_dsn: str | None = None) -> Callable[[], str | None] | None:
    """Why a run of the stage would have nothing to do now (idle.py: a string), or None:
    run it. None for a pull, which cannot tell without reading the slot."""
    checks = {"extract": lambda: idle.capture_idle(store, config, group, None),
              "pump": lambda: idle.pump_idle(store, config, group),
              "replicat": lambda: idle.replicat_idle(store, config, group, target_dsn)}
    return checks.get(kind)


def repeat(run_once: Callable[[], None], nothing_to_do: Callable[[], str | None] | None, poll: float) -> None:
    """`... run --loop`: `run_once` whenever `nothing_to_do` says None, else wait `poll`
    seconds (no `nothing_to_do`, a pull: run, then wait `poll` seconds); until SIGTERM or SIGINT (the run in progress ends first) or until the
    process that started this one has gone (no orphan loops on after a killed
    supervisor). A failed run ends the loop with its error."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    parent = os.getppid()
    while not stop.is_set() and os.getppid() == parent:
        if nothing_to_do is None:
            run_once()
            stop.wait(poll)
        elif nothing_to_do() is None:
            run_once()
        else:
            stop.wait(poll)


class _Running:
    """A stage's process: its output relayed line by line, its errors kept in a file."""

    def __init__(self, stage: Stage, argv: list[str], lock: threading.Lock):
        self.stage = stage
        self.errors = tempfile.TemporaryFile("w+")
        # Its own session: a Ctrl-C at the terminal reaches the supervisor only (and not a
        # capture's JVM), which then stops each stage after its run in progress.
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.errors, text=True,
                                        start_new_session=True)
        self.stopping = False
        self.relay = threading.Thread(target=self._relay, args=(lock,), daemon=True)
        self.relay.start()

    def _relay(self, lock: threading.Lock) -> None:
        for line in self.process.stdout:
            with lock:
                print(line, end="", flush=True)

    def stop(self) -> None:
        if self.process.poll() is None and not self.stopping:
            self.stopping = True
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the process and its JVM

    def failure(self) -> str:
        """Why the process ended: its last ERROR line, the signal that killed it, or the
        tail of what it wrote."""
        code = self.process.returncode
        if code < 0:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        self.errors.seek(0)
        text = self.errors.read()
        failed = [line.removeprefix("ERROR ") for line in text.splitlines() if line.startswith("ERROR ")]
        if failed:
            return failed[-1]
        return f"exit status {code}" + (f": {' '.join(text.strip()[-500:].split())}" if text.strip() else "")

    def close(self) -> None:
        self.relay.join(timeout=5)
        self.errors.close()


@dataclass
class Replicated:
    source: str
    stages: list[Stage]
    seconds: float
    interrupted: bool = False

    def describe(self) -> str:
        if self.interrupted:
            return (f"Source {self.source}: interrupted after {self.seconds:.1f} s; every stage stopped after its "
                    "run in progress")
        return (f"Source {self.source}: caught up in {self.seconds:.1f} s (the source's end at the start applied; "
                f"stages {', '.join(str(s) for s in self.stages)})")


def caught_up(store: MetadataStore, config: Config, stages: list[Stage], target_dsn: str | None) -> bool:
    """Every group has nothing to do, asked upstream first (see the module's docstring)."""
    return all(idle_check(s.kind, store, config, s.group, target_dsn)() is not None
               for s in stages if s.kind != "pull")


def replicate(store: MetadataStore, config: Config, source: str, *, config_file: str | None = None,
              remote: str | None = None, follow: bool = False, poll: float = 1.0,
              target_dsn: str | None = None) -> Replicated:
    """Run the source's stages at once until caught up (or, `follow`, until interrupted);
    raise one TrailboundError naming the stage that failed."""
    source = config.source_name(source)
    stages = pipeline(config, source)
    options = [*(["--config", str(config_file)] if config_file else []), *(["--remote", remote] if remote else [])]
    lock = threading.Lock()
    started = time.monotonic()
    running = [_Running(stage, [sys.executable, "-m", "trailbound.cli", *options,
                                *stage.words(loop=stage.kind != "pull" or follow, poll=poll)], lock)
               for stage in stages]
    failed: _Running | None = None
    interrupted = False
    try:
        while True:
            for child in running:
                code = child.process.poll()
                if code is not None and not (code == 0 and child.stage.kind == "pull" and not follow):
                    failed = child  # a loop ends only when told to; the one pull ends by itself
                    break
            if failed or (not follow and all(c.process.poll() == 0 for c in running if c.stage.kind == "pull")
                          and caught_up(store, config, stages, target_dsn)):
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        _stop_all(running)
    seconds = time.monotonic() - started
    if failed:
        others = [c for c in running if c is not failed and c.process.returncode not in (0, None)
                  and not c.stopping]
        also = "".join(f"; {c.stage} failed too: {c.failure()}" for c in others)
        raise TrailboundError(f"replicate {source}: {failed.stage} failed: {failed.failure()}{also}; "
                              "the other stages stopped after their runs in progress")
    return Replicated(source, stages, seconds, interrupted)


def _stop_all(running: list[_Running]) -> None:
    """Each loop ends after its run in progress; a second interrupt kills them outright."""
    for child in running:
        child.stop()
    try:
        for child in running:
            child.process.wait()
    except KeyboardInterrupt:
        print("interrupted again: killing every stage (each run's checkpoints commit atomically: a rerun "
              "goes on from them)", file=sys.stderr)
        for child in running:
            child.kill()
        for child in running:
            child.process.wait()
    for child in running:
        child.close()
