"""Prometheus metrics of the Redis loader, on their own registry; served when flink.loader_metrics_port > 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class LoaderMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.records = Counter("rtrec_loader_records", "Feature records written to Redis", registry=r)
        self.slots = Counter("rtrec_loader_slots_written", "(entity, horizon) slots replaced (newest wins)",
                             registry=r)
        self.dead_lettered = Counter("rtrec_loader_dead_lettered", "Undecodable feature records dead-lettered",
                                     registry=r)
        self.retries = Counter("rtrec_loader_retries", "Transient Redis or Kafka failures retried", ["what"],
                               registry=r)
        self.lag = Gauge("rtrec_loader_consumer_lag", "Feature records not yet consumed", registry=r)
        self.freshness = Gauge("rtrec_loader_freshness_seconds",
                               "Window end -> readable in Redis, over the last batch", ["quantile"], registry=r)
        self.last_batch = Gauge("rtrec_loader_last_batch_timestamp_seconds", "When the last batch was written",
                                registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
