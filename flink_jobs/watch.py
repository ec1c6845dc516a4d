"""What `features run` does every second beside waiting: notice the job's restarts and say why, keep
its Prometheus metrics current, and find the root cause when the job ends."""

from __future__ import annotations

import contextlib
import time
import urllib.error
from collections.abc import Callable
from typing import Any

from core.kafka import group_lag
from core.settings import Settings
from flink_jobs.monitor import FlinkRest, JobHealth, directory_problem, missing_acl, root_cause
from flink_jobs.telemetry import DeadLetterTally, JobMetrics

_REST_ERRORS = (OSError, urllib.error.URLError, KeyError, ValueError)
ENDED = ("FAILED", "CANCELED", "FINISHED", "GONE")


class JobWatch:
    def __init__(self, settings: Settings, job_client: Any, rest_url: str | None, say: Callable[[str], None],
                 poll_every_s: float = 5.0) -> None:
        f, k = settings.flink, settings.kafka
        self.settings = settings
        self.client = job_client
        self.job_id = str(job_client.get_job_id())
        self.rest = FlinkRest(rest_url, kafka=settings.kafka) if rest_url else None
        self.say = say
        self.poll_every_s = poll_every_s
        self.metrics = JobMetrics()
        if f.job_metrics_port:
            self.metrics.serve(f.job_metrics_port, settings.services.metrics_host)
        self.tally = DeadLetterTally(k.bootstrap_servers, k.topics.dead_letter, self.metrics,
                                     security=k.security.librdkafka())
        self.health: JobHealth | None = None
        self.restarts = 0
        self._next_poll = 0.0
        self._dir_problem: str | None = None
        self._state = ""
        self._late_dropped = 0

    def tick(self) -> str:
        """The job's state now (GONE once the mini-cluster has shut down with it); a restart is
        reported, with its cause, the first time it is seen."""
        try:
            state = str(self.client.get_job_status().result())
        except Exception:  # py4j: the per-job mini-cluster shuts down as soon as its job has ended
            return "GONE"
        if self.rest is not None:
            try:
                # a restart's RESTARTING state spans several ticks (the restart delay): counted once
                restarted = (state == "RESTARTING" and self._state != "RESTARTING") \
                    or self.rest.restarts(self.job_id) > self.restarts
                if restarted or time.monotonic() >= self._next_poll:
                    self._poll(restarted)
            except _REST_ERRORS:
                pass  # the REST API is busy or going away with the job: the next tick asks again
        elif state == "RESTARTING" and self._state != "RESTARTING":
            self.restarts += 1
            self.say("feature job RESTARTING (no REST API to ask why: see the Flink log)")
        self._state = state
        self.tally.poll()
        return state

    def _poll(self, restarted: bool) -> None:
        assert self.rest is not None
        self._next_poll = time.monotonic() + self.poll_every_s
        self.health = health = self.rest.health(self.job_id)
        f, k = self.settings.flink, self.settings.kafka
        try:
            lag: int | None = sum(group_lag(k.bootstrap_servers, f.group_id, k.topics.events, timeout_s=2.0,
                                            security=k.security.librdkafka()).values())
        except Exception:  # Kafka unreachable right now: the lag gauge keeps its last value
            lag = None
        self.metrics.update(health, lag)
        if health.late_dropped and health.late_dropped > self._late_dropped:
            self.say(f"feature job: {health.late_dropped} records dropped behind an operator's watermark since its "
                     "last restart (rtrec_job_late_dropped); late events are meant to reach the dead-letter topic "
                     "before any operator")
        self._late_dropped = health.late_dropped or 0
        restarts = max(health.restarts, self.restarts + (1 if restarted else 0))
        if restarts > self.restarts:
            self.restarts = restarts
            self.say(f"feature job RESTARTING (restart {restarts}; more than {f.max_restarts} within "
                     f"{f.restart_window_s} s and it gives up): {self.cause_seen() or 'cause not reported yet'}")

    def cause_seen(self) -> str | None:
        """The newest failure's root cause, with the failed checkpoint's reason when a checkpoint failed
        (Flink's exception for that names no cause of its own)."""
        if self.health is None or not self.health.root_cause:
            return None
        cause = self.health.root_cause
        if "checkpoint" in cause.lower():
            # a failing checkpoint frees its partial files: the probe may pass now and fail again next time
            self._dir_problem = directory_problem(self.settings.flink.checkpoint_dir) or self._dir_problem
            failure = self.health.checkpoint_failure
            cause += "".join(f" ({text})" for text in (
                f"the last failed checkpoint: {failure}" if failure else "",
                f"checkpoint directory {self._dir_problem}" if self._dir_problem else "") if text)
        acl = missing_acl(cause, self.settings.kafka) or self.health.missing_acl
        return f"{cause} ({acl})" if acl else cause

    def final_cause(self) -> str:
        """Why the job ended: the innermost cause of its execution result, and what was seen before."""
        chain = ""
        try:
            self.client.get_job_execution_result().result()
            ended = "no cause reported"
        except Exception as exc:  # py4j wraps the Java exception: its text carries the chain
            chain = str(exc)
            ended = root_cause(chain) or type(exc).__name__
        if self.rest is not None:  # the failures the last poll may have missed (a job that failed fast)
            with contextlib.suppress(*_REST_ERRORS):
                self.health = self.rest.health(self.job_id)
        seen = self.cause_seen()
        if seen and (ended in seen or "checkpoint" in ended.lower()):
            ended = seen
        acl = (missing_acl(f"{ended}\n{chain}", self.settings.kafka)
               or (self.health.missing_acl if self.health else None))
        if acl and acl not in ended:
            ended += f" ({acl})"
        return f"{ended} ({self.restarts} restarts before)" if self.restarts else ended

    def close(self) -> None:
        self.tally.close()
