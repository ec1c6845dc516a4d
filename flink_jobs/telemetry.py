"""Prometheus metrics of the feature job (rtrec_job_*), on their own registry, updated by `features run`
from the job's REST figures, its consumer group's lag and the dead letters it writes."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import OFFSET_END, Consumer, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from core.kafka import consumer_config, poll_messages
from flink_jobs.monitor import JobHealth, reason_kind
from schemas.serde import SerdeError, deserializer, header_of


class JobMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running = Gauge("rtrec_job_running", "1 while the feature job is RUNNING", registry=r)
        self.restarts = Gauge("rtrec_job_restarts", "Restarts of the feature job since it was submitted", registry=r)
        self.events_in = Gauge("rtrec_job_events_in", "Events read by the job's source (since its last restart)",
                               registry=r)
        self.features_out = Gauge("rtrec_job_features_out", "Feature records sent (since its last restart)",
                                  registry=r)
        self.event_time_lag = Gauge("rtrec_job_event_time_lag_seconds",
                                    "Wall clock minus the event time of the events the job reads now (freshness)",
                                    registry=r)
        self.late_dropped = Gauge("rtrec_job_late_dropped",
                                  "Records the job's operators dropped behind their watermark (since its last restart)",
                                  registry=r)
        self.lag = Gauge("rtrec_job_consumer_lag", "Events not yet consumed by the job (committed at checkpoints)",
                         registry=r)
        self.checkpoint_age = Gauge("rtrec_job_last_checkpoint_age_seconds", "Age of the last completed checkpoint",
                                    registry=r)
        self.dead_letters = Counter("rtrec_job_dead_letters", "Dead letters the job wrote, by kind of reason",
                                    ["kind"], registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)

    def update(self, health: JobHealth, lag: int | None) -> None:
        self.running.set(1 if health.state == "RUNNING" else 0)
        self.restarts.set(health.restarts)
        if health.events_in is not None:
            self.events_in.set(health.events_in)
        if health.features_out is not None:
            self.features_out.set(health.features_out)
        if health.event_time_lag_ms is not None:
            self.event_time_lag.set(health.event_time_lag_ms / 1000)
        if health.late_dropped is not None:
            self.late_dropped.set(health.late_dropped)
        if health.last_checkpoint_age_s is not None:
            self.checkpoint_age.set(health.last_checkpoint_age_s)
        if lag is not None:
            self.lag.set(lag)


class DeadLetterTally:
    """Counts the feature job's dead letters by kind of reason as they are committed, from the end of
    the dead-letter topic at start (no consumer group: nothing is committed, nothing is left behind)."""

    def __init__(self, bootstrap: str, topic: str, metrics: JobMetrics, timeout_s: float = 10.0,
                 security: Mapping[str, str] | None = None) -> None:
        self._consumer = Consumer(consumer_config(bootstrap, "rtrec-dead-letter-tally", **(security or {})))
        partitions = self._consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in partitions])
        self._decode = deserializer("DeadLetter")
        self._metrics = metrics

    def poll(self) -> int:
        """Counts what arrived since the last call; returns how many."""
        n = 0
        for msg in poll_messages(self._consumer, 10_000, timeout_s=0.1):
            try:
                dead = self._decode(msg.value(), header_of(msg.headers()))
            except SerdeError:
                continue  # a dead-letter record this tally cannot read is not the job's: it writes the current schema
            if dead["stage"] == "feature-job":
                self._metrics.dead_letters.labels(reason_kind(dead["reason"])).inc()
                n += 1
        return n

    def close(self) -> None:
        self._consumer.close()
