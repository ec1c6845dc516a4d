"""A running feature job seen through Flink's REST API: its state, restarts and the root cause of the
newest failure, the last completed checkpoint, and records in and out.

`features run` records where its job answers (`RunningJob`, a small JSON file beside the job's
checkpoints), prints every restart with its cause and exports the figures as Prometheus metrics;
`features status` reads the same figures from another process.

>>> root_cause("org.apache.flink.runtime.JobException: Recovery is suppressed\\n\\tat a.b(C.java:1)\\n"
...            "Caused by: java.io.IOException: No space left on device\\n\\tat d.e(F.java:2)")
'java.io.IOException: No space left on device'
>>> reason_kind("late: event_time 1 is behind the watermark 2023-11-14"), reason_kind("dwell_ms -5 is negative")
('late', 'out_of_range')
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.settings import KafkaSettings

# Metric ids of the job's operators (the number in brackets is the planner's and may change)
_EVENTS_IN = re.compile(r"^Source__events_raw\[\d+\]\.numRecordsOut$")
_FEATURES_OUT = re.compile(r"^features_sink\[\d+\]__Writer\.numRecordsSend$")
_DEAD_LETTERS_OUT = re.compile(r"^dead_letter_sink\[\d+\]__Writer\.numRecordsSend$")
_EVENT_TIME_LAG = re.compile(r"^Source__events_raw\[\d+\]\.currentEmitEventTimeLag$")
# Every operator that drops records behind its watermark (over aggregates, windows) counts them here
_LATE_DROPPED = re.compile(r"\.numLateRecordsDropped$")
_FIGURES = (("events_in", _EVENTS_IN, "sum"), ("features_out", _FEATURES_OUT, "sum"),
            ("dead_letters_out", _DEAD_LETTERS_OUT, "sum"), ("event_time_lag_ms", _EVENT_TIME_LAG, "max"),
            ("late_dropped", _LATE_DROPPED, "sum"))

# The first words of the job's dead-letter reasons (the JVM decoder's and the late filter's)
_REASON_KINDS = (("late:", "late"), ("undecodable", "undecodable"), ("missing rtrec-schema", "no_schema_header"),
                 ("unknown schema", "unknown_schema"), ("missing required", "missing_field"),
                 ("unknown event_type", "unknown_event_type"), ("value of", "too_large"),
                 ("empty value", "empty"))


def reason_kind(reason: str) -> str:
    """A dead-letter reason reduced to a small set of kinds (a label value, unlike the reason itself)."""
    for prefix, kind in _REASON_KINDS:
        if reason.startswith(prefix):
            return kind
    if reason.startswith("an id is longer"):
        return "too_long"
    if reason.startswith(("event_time ", "dwell_ms ", "position ")):
        return "out_of_range"
    return "other"


_NOT_AUTHORIZED = re.compile(r"Not authorized to access (topics|group): \[?([^\]\s]+)")


def missing_acl(cause: str, kafka: KafkaSettings) -> str | None:
    """What a Kafka authorization failure in `cause` means for this job: which ACL its user lacks.

    >>> k = KafkaSettings(security={"protocol": "SASL_SSL", "username": "job"})
    >>> missing_acl("org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access "
    ...             "topics: [rtrec.features]", k)
    'Kafka user job lacks the WRITE ACL on topic rtrec.features (the job writes it)'
    >>> missing_acl("...GroupAuthorizationException: Not authorized to access group: rtrec-features", k)
    'Kafka user job lacks the READ ACL on group rtrec-features (the job reads the events topic as it)'
    """
    user = kafka.security.username or "ANONYMOUS"
    if "TransactionalIdAuthorizationException" in cause or "Transactional Id authorization failed" in cause:
        return (f"Kafka user {user} lacks the WRITE ACL on the transactional ids of the job's exactly-once sinks "
                "(prefix rtrec-)")
    found = _NOT_AUTHORIZED.search(cause)
    if found is None:
        return None
    kind, name = found.groups()
    if kind == "group":
        return f"Kafka user {user} lacks the READ ACL on group {name} (the job reads the events topic as it)"
    t = kafka.topics
    if name in (t.features, t.samples, t.dead_letter):
        return f"Kafka user {user} lacks the WRITE ACL on topic {name} (the job writes it)"
    return f"Kafka user {user} lacks the READ and DESCRIBE ACLs on topic {name} (the job reads it)"


def root_cause(stacktrace: str) -> str:
    """The innermost `Caused by:` of a Java stack trace, else its first line."""
    causes = [line.removeprefix("Caused by: ").strip() for line in stacktrace.splitlines()
              if line.startswith("Caused by: ")]
    return causes[-1] if causes else stacktrace.strip().splitlines()[0] if stacktrace.strip() else ""


@dataclass(frozen=True)
class JobHealth:
    job_id: str
    state: str
    restarts: int
    root_cause: str | None  # of the newest failure, when there was one
    checkpoint_failure: str | None  # why the newest failed checkpoint failed (its exception names no cause)
    last_checkpoint_id: int | None
    last_checkpoint_age_s: float | None
    events_in: int | None  # None until Flink's metric fetcher has seen the operators
    features_out: int | None
    dead_letters_out: int | None
    event_time_lag_ms: int | None  # wall clock minus the event time of the events the source emits now
    # Records an operator dropped behind its watermark, summed over operators: 0 is what the job is built
    # for (late events are dead-lettered before any operator sees them); more is data lost uncounted
    late_dropped: int | None = None
    # A Kafka ACL the job lacks, found in any failure of its history: after an authorization error the
    # newest failure is often what followed it (tasks that did not cancel, a task manager shut down)
    missing_acl: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class FlinkRest:
    """The few REST calls the monitor needs, against a mini-cluster or a standalone cluster."""

    def __init__(self, url: str, timeout_s: float = 5.0, kafka: KafkaSettings | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.kafka = kafka  # given: each failure is searched for the Kafka ACL it names
        self._metric_ids: dict[str, dict[str, set[str]]] = {}  # job id -> figure -> {"vertex id/metric id"}

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=self.timeout_s) as response:
            return json.load(response)

    def health(self, job_id: str) -> JobHealth:
        job = self.get(f"/jobs/{job_id}")
        history = self.get(f"/jobs/{job_id}/exceptions").get("exceptionHistory", {}).get("entries", [])
        restarts = _metric_value(self.get(f"/jobs/{job_id}/metrics?get=numRestarts"), "numRestarts")
        latest = self.get(f"/jobs/{job_id}/checkpoints").get("latest") or {}
        completed, failed = latest.get("completed") or {}, latest.get("failed") or {}
        acked = completed.get("latest_ack_timestamp")
        figures = self._figures(job_id, [v["id"] for v in job.get("vertices", [])])
        traces = "\n".join(entry.get("stacktrace", "") for entry in history)
        acl = missing_acl(traces, self.kafka) if self.kafka is not None else None
        return JobHealth(
            missing_acl=acl,
            job_id=job_id, state=job["state"],
            # numRestarts lags by the metric fetcher's interval; every failure is in the history at once
            restarts=max(int(restarts or 0), len(history) - (1 if job["state"] == "FAILED" else 0)),
            root_cause=root_cause(history[0].get("stacktrace", "")) or history[0].get("exceptionName")
            if history else None,
            checkpoint_failure=failed.get("failure_message"),
            last_checkpoint_id=completed.get("id"),
            last_checkpoint_age_s=round(time.time() - acked / 1000, 1) if acked else None,
            events_in=figures.get("events_in"), features_out=figures.get("features_out"),
            dead_letters_out=figures.get("dead_letters_out"), event_time_lag_ms=figures.get("event_time_lag_ms"),
            late_dropped=figures.get("late_dropped"))

    def restarts(self, job_id: str) -> int:
        """One cheap call: the job's restart count as Flink's metric fetcher last saw it."""
        return int(_metric_value(self.get(f"/jobs/{job_id}/metrics?get=numRestarts"), "numRestarts") or 0)

    def _figures(self, job_id: str, vertices: list[str]) -> dict[str, int]:
        """Each figure aggregated (sum or max) over its metric in every subtask, then summed over the
        operators that have one."""
        found = self._metric_ids.get(job_id, {})
        if len(found) < len(_FIGURES):
            found = {}
            for vertex in vertices:
                for m in self.get(f"/jobs/{job_id}/vertices/{vertex}/subtasks/metrics"):
                    for figure, pattern, _agg in _FIGURES:
                        if pattern.search(m["id"]):
                            found.setdefault(figure, set()).add(f"{vertex}/{m['id']}")
            self._metric_ids[job_id] = found
        out = {}
        for figure, _pattern, agg in _FIGURES:
            for vertex_metric in sorted(found.get(figure, ())):
                vertex, metric = vertex_metric.split("/", 1)
                got = self.get(f"/jobs/{job_id}/vertices/{vertex}/subtasks/metrics?get={metric}&agg={agg}")
                if got and agg in got[0]:
                    out[figure] = out.get(figure, 0) + int(float(got[0][agg]))
        return out


def _metric_value(metrics: list[dict[str, Any]], name: str) -> str | None:
    return next((m.get("value") for m in metrics if m.get("id") == name), None)


def directory_problem(path: Path, probe_bytes: int = 1 << 20) -> str | None:
    """Why `path` cannot take a file of `probe_bytes` now (full, read-only, missing), or None: Flink's
    exception for a failed checkpoint names no cause, so `features run` asks the filesystem itself."""
    probe = path / f".rtrec-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as out:
            out.write(b"\0" * probe_bytes)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def mini_cluster_rest_url(job_client: Any) -> str | None:
    """Where the embedded mini-cluster running `job_client`'s job answers REST (a random port), read from
    the Java client; None for a client of another kind."""
    try:
        j_client = job_client._j_job_client
        field = j_client.getClass().getDeclaredField("miniCluster")
        field.setAccessible(True)
        return str(field.get(j_client).getRestAddress().get().toString()).replace("localhost", "127.0.0.1")
    except Exception:  # py4j raises its own types; any failure means: not a mini-cluster client
        return None


@dataclass(frozen=True)
class RunningJob:
    """What `features run` leaves for `features status`: the job, where it answers, and who runs it."""

    job_id: str
    rest_url: str
    pid: int

    @staticmethod
    def path(checkpoint_dir: Path) -> Path:
        return checkpoint_dir / "running-job.json"

    def record(self, checkpoint_dir: Path) -> None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path(checkpoint_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(self.path(checkpoint_dir))

    @classmethod
    def find(cls, checkpoint_dir: Path) -> RunningJob | None:
        """The recorded job if its process still lives."""
        try:
            found = cls(**json.loads(cls.path(checkpoint_dir).read_text()))
            os.kill(found.pid, 0)
        except (OSError, ValueError, TypeError):
            return None
        return found

    def forget(self, checkpoint_dir: Path) -> None:
        with contextlib.suppress(OSError):
            self.path(checkpoint_dir).unlink()


def health_or_reason(running: RunningJob | None) -> dict[str, Any]:
    """The job's health as a dict for `features status`, or why there is none."""
    if running is None:
        return {"state": "not running (no `rtrec features run` process recorded for these checkpoints)"}
    try:
        return FlinkRest(running.rest_url).health(running.job_id).as_dict()
    except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
        return {"job_id": running.job_id,
                "state": f"unknown (its REST API at {running.rest_url} did not answer: {exc})"}
