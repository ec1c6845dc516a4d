"""The demo's trainer in a process of its own, as `train run` runs beside `features run`, and at a lower
CPU priority (nice 10): on a small machine its work (a snapshot of about 70 MB every 5 s) took the cores
from the feature job when windows closed, and the windows reached Redis later. The trainer catches up
between them. Measured in demos at the default rate on the 2-core machine: windows freshness p99 4.72 s
with the trainer a thread of the demo's process, 4.62 s in a process of its own, 2.71 s niced, and 1.89 s
with no trainer at all (README "The demo")."""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.settings import Settings

NICENESS = 10


@dataclass
class TrainerOutcome:
    """What the demo reports of its trainer: the snapshots, the samples trained, and the scores the
    leading learner gave each sample before learning from it (a ScoreLog's arrays)."""

    written: list[int] = field(default_factory=list)
    promoted: list[int] = field(default_factory=list)
    samples_trained: int = 0
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    error: str | None = None


def portable(settings: Settings) -> Settings:
    """The same settings as a plain `Settings`, which pickles: with a settings file, load_settings returns
    an instance of a class local to it, which does not (a spawned process gets its arguments pickled).

    >>> import pickle, tempfile
    >>> from pathlib import Path
    >>> from core.settings import load_settings
    >>> toml = Path(tempfile.mkdtemp()) / "rtrec.toml"
    >>> _ = toml.write_text('[kafka]\\nbootstrap_servers = "broker:9093"\\n')
    >>> loaded = load_settings(toml)
    >>> pickle.loads(pickle.dumps(portable(loaded))).kafka.bootstrap_servers
    'broker:9093'
    >>> type(portable(loaded)).__name__, portable(loaded).model_dump() == loaded.model_dump()
    ('Settings', True)
    """
    return Settings.model_validate(settings.model_dump())


class TrainerProcess:
    """`TrainerService.from_settings(settings)` run in a spawned process until `stop()`. While it runs,
    `newest_event_ms` and `samples_trained` follow its progress (updated at each poll)."""

    def __init__(self, settings: Settings) -> None:
        ctx = multiprocessing.get_context("spawn")  # this process holds a JVM gateway and threads: no fork
        self._stop = ctx.Event()
        self._newest = ctx.Value("q", -1, lock=False)
        self._trained = ctx.Value("q", 0, lock=False)
        self._outcome: multiprocessing.Queue[TrainerOutcome] = ctx.Queue()
        self._process = ctx.Process(target=_train, name="rtrec-demo-trainer", daemon=True,
                                    args=(portable(settings), os.getpid(), self._stop, self._newest, self._trained,
                                          self._outcome))

    def start(self) -> None:
        self._process.start()

    def is_alive(self) -> bool:
        return self._process.is_alive()

    @property
    def newest_event_ms(self) -> int | None:
        return None if self._newest.value < 0 else int(self._newest.value)

    @property
    def samples_trained(self) -> int:
        return int(self._trained.value)

    def stop(self, timeout_s: float = 120.0) -> TrainerOutcome:
        """Asks it to stop (it writes its final snapshot first) and returns its outcome; an outcome with
        `error` set when it failed or did not answer within `timeout_s`."""
        self._stop.set()
        if self._process.pid is None:
            return TrainerOutcome(error="the trainer process was never started")
        deadline = time.monotonic() + timeout_s
        outcome = None
        while outcome is None:
            ended = not self._process.is_alive()
            try:
                # before join: a process does not end while its queue still holds what it put
                outcome = self._outcome.get(timeout=1.0)
            except queue.Empty:
                if ended:  # and nothing came after it ended: killed, or it died before reporting
                    outcome = TrainerOutcome(error=f"the trainer process ended with exit code "
                                                   f"{self._process.exitcode} and no outcome")
                elif time.monotonic() > deadline:
                    outcome = TrainerOutcome(error=f"the trainer did not stop within {timeout_s:.0f} s")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
        return outcome


def _train(settings: Settings, parent_pid: int, stop: Any, newest: Any, trained: Any, outcome: Any) -> None:
    """The spawned process: `stop` an Event, `newest` and `trained` shared int64 values, `outcome` a Queue."""
    # Ctrl-C reaches the whole process group: the demo stops this process itself, after the final
    # snapshot, through `stop`
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(NICENESS)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from gpu_trainer.prequential import ScoreLog
    from gpu_trainer.service import TrainerService

    result, trainer, logs = TrainerOutcome(), None, {}
    try:
        trainer = TrainerService.from_settings(settings)
        learners = getattr(trainer.learner, "variants", None) or {"": trainer.learner}
        for name, learner in learners.items():  # each shadow variant has its own
            learner.score_log = logs[name] = ScoreLog()

        def should_stop() -> bool:
            newest.value = trainer.newest_event_ms if trainer.newest_event_ms is not None else -1
            trained.value = trainer.learner.samples_trained
            return stop.is_set() or os.getppid() != parent_pid  # the demo is gone: stop, not run on alone

        trainer.run(should_stop=should_stop)
    except Exception as exc:
        traceback.print_exc()
        result.error = f"{type(exc).__name__}: {exc}"
    if trainer is not None:  # what it did before a failure is reported too
        gate = getattr(trainer.learner, "gate", None)
        result.scores = logs[gate.leader if gate is not None else ""].arrays()
        result.written, result.promoted = list(trainer.written), list(trainer.promoted)
        result.samples_trained = trainer.learner.samples_trained
    if os.getppid() == parent_pid:  # else no one reads it, and the queue's feeder would hold the exit
        outcome.put(result)
