"""Prometheus metrics of the trainer, on their own registry; served when trainer.metrics_port > 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class TrainerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.samples = Counter("rtrec_trainer_samples", "Samples trained", registry=r)
        self.dead_lettered = Counter("rtrec_trainer_dead_lettered", "Samples sent to the dead-letter topic",
                                     registry=r)
        self.samples_per_s = Gauge("rtrec_trainer_samples_per_second", "Training rate over the last batch",
                                   registry=r)
        self.batch_latency = Histogram("rtrec_trainer_batch_seconds", "Time to train one micro-batch", registry=r,
                                       buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.lag = Gauge("rtrec_trainer_consumer_lag", "Samples not yet consumed", registry=r)
        self.auc = Gauge("rtrec_trainer_prequential_auc", "Rolling prequential AUC", registry=r)
        self.variant_auc = Gauge("rtrec_trainer_variant_auc", "Rolling prequential AUC of each shadow learner",
                                 ["variant"], registry=r)
        self.variant_published = Gauge("rtrec_trainer_variant_published",
                                       "1 for the shadow learner whose weights are published, else 0", ["variant"],
                                       registry=r)
        self.logloss = Gauge("rtrec_trainer_prequential_logloss", "Rolling prequential logloss", registry=r)
        self.version = Gauge("rtrec_trainer_snapshot_version", "Latest snapshot version written", registry=r)
        self.current = Gauge("rtrec_trainer_current_version", "Promoted (current) snapshot version", registry=r)
        self.collision_rate = Gauge("rtrec_trainer_embedding_collision_rate",
                                    "Share of distinct ids that share an embedding row", ["table"], registry=r)
        self.snapshot_failures = Counter("rtrec_trainer_snapshot_write_failures",
                                         "Snapshots that could not be written (e.g. a full disk)", registry=r)
        self.freshness = Gauge("rtrec_trainer_freshness_seconds",
                               "Snapshot time minus the newest event time it contains", registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
