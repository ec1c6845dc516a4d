"""`rtrec train autoscale`: the lag-based scaling policy (gpu_trainer/scaling.py) applied to trainer ranks.

The controller reads the trainer group's lag on the samples topic from Kafka (the offsets rank 0
commits with each snapshot), asks the policy how many ranks it calls for, and runs the trainer as a
torchrun job of that many ranks (gpu_trainer/distributed.py). On this machine a change stops the job
and starts it again with the new count: the ranks write a last snapshot and the new ones resume from
it. Growing an elastic job across machines by starting and stopping torchrun agents in one c10d
rendezvous is not done: tried here with agents on one machine, the agents' rank assignment after a
membership change timed out (torch 2.15).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from core.kafka import group_lag
from core.settings import Settings
from gpu_trainer.scaling import Decision, Scale, ScalingPolicy

log = logging.getLogger("rtrec.autoscale")
_COORDINATOR = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                KafkaError.COORDINATOR_NOT_AVAILABLE)
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class TrainerRanks:
    """The trainer as one torchrun job of N ranks on this machine. A new N stops the job (SIGTERM: the
    ranks agree on a last round, rank 0 writes its snapshot, all exit 0) and starts it again with N ranks,
    which resume from that snapshot: nothing is lost and nothing trained twice."""

    env: dict[str, str]  # the RTREC_* settings every rank reads, beyond this process's environment
    log_file: Path
    stop_timeout_s: float = 90.0
    job: subprocess.Popen | None = None
    ranks: int = 0

    def command(self, ranks: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                "--max-restarts=3", "-m", "rtrec", "train", "run"]

    def running(self) -> int:
        if self.job is not None and self.job.poll() is not None:
            log.error("the trainer ranks ended by themselves (exit %s); see %s", self.job.returncode, self.log_file)
            self.job, self.ranks = None, 0
        return self.ranks

    def resize(self, ranks: int) -> None:
        if self.running() == ranks:
            return
        self.stop()
        with open(self.log_file, "ab") as out:
            self.job = subprocess.Popen(self.command(ranks), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
                                        start_new_session=True)
        self.ranks = ranks

    def stop(self) -> int | None:
        """Stops the job; its exit code (None when none ran)."""
        job, self.job, self.ranks = self.job, None, 0
        if job is None:
            return None
        # torchrun alone: it passes one SIGTERM to each rank (a second would make the rank exit at once)
        with contextlib.suppress(ProcessLookupError):
            job.send_signal(signal.SIGTERM)
        try:
            return job.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            return job.wait(10)


@dataclass
class Autoscaler:
    """One decision per tick: the group's lag from Kafka, the policy's answer, the ranks resized."""

    settings: Settings
    ranks: TrainerRanks
    policy: ScalingPolicy
    scale: Scale = field(default_factory=lambda: Scale(workers=0, changed_at_s=None))
    decisions: list[tuple[float, int, Decision]] = field(default_factory=list)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.lag_gauge = Gauge("rtrec_autoscale_lag", "Records the trainer group is behind on the samples topic",
                               registry=self.registry)
        self.wanted_gauge = Gauge("rtrec_autoscale_ranks_wanted", "Ranks the policy calls for", registry=self.registry)
        self.running_gauge = Gauge("rtrec_autoscale_ranks_running", "Trainer ranks running", registry=self.registry)

    def serve(self, port: int) -> None:
        start_http_server(port, addr=self.settings.services.metrics_host, registry=self.registry)

    def lag(self, attempts: int = 10) -> tuple[int, int]:
        """(records behind, partitions) of the trainer group on the samples topic. A group coordinator
        that is moving or still loading is asked again, up to `attempts` times a second apart."""
        k = self.settings.kafka
        for attempt in range(attempts):
            try:
                lags = group_lag(k.bootstrap_servers, self.settings.trainer.group_id, k.topics.samples,
                                 security=k.security.librdkafka())
                return sum(max(0, v) for v in lags.values()), len(lags)
            except KafkaException as exc:
                if attempt + 1 == attempts or not (exc.args[0].retriable() or exc.args[0].code() in _COORDINATOR):
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def tick(self, now_s: float) -> Decision:
        lag, partitions = self.lag()
        if self.scale.workers == 0:  # the first tick starts the fewest the bounds allow, then follows the lag
            fewest, _ = self.policy.bounds(partitions)
            decision = Decision(max(fewest, self.policy.target(lag, partitions)), True, f"start with lag {lag}")
        else:
            decision = self.policy.decide(self.scale, lag, partitions, now_s)
        if decision.changed:
            log.info("ranks %d -> %d: %s", self.scale.workers, decision.workers, decision.reason)
            self.ranks.resize(decision.workers)
            self.scale = Scale(decision.workers, now_s)
        self.decisions.append((now_s, lag, decision))
        self.lag_gauge.set(lag)
        self.wanted_gauge.set(decision.workers)
        self.running_gauge.set(self.ranks.running())
        return decision

    def run(self, interval_s: float, should_stop: Callable[[], bool]) -> None:
        """Ticks until `should_stop()`. A lag that cannot be read (Kafka restarting) skips a tick: the
        ranks run on as they are."""
        while not should_stop():
            try:
                self.tick(time.monotonic())
            except KafkaException as exc:
                if self.scale.workers == 0:
                    raise
                log.warning("lag not read, ranks stay at %d: %s", self.scale.workers, exc)
            deadline = time.monotonic() + interval_s
            while time.monotonic() < deadline and not should_stop():
                time.sleep(0.2)
