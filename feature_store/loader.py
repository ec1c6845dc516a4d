"""Feeds Redis from the features topic: large batches, one pipeline per batch.

Why a loader and not a sink inside the Flink job: a Python operator in the job moved 7-11k rows/s
here, while this loader writes from outside the JVM at the Redis pipeline's rate, and scales by
adding loaders to the consumer group (one per partition). Exactly-once into Redis comes from the
newest-window-wins script: a replayed record can never overwrite a newer window, so consuming at
least once (commit after the Redis write) leaves the same state as exactly once. For the same
reason it may read uncommitted records (the default in Settings.flink.loader_isolation): windows
reach Redis when the job sends them instead of at the next checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from core.kafka import ensure_topics, producer_config
from core.settings import Settings
from feature_store.base import FeatureWriter
from schemas.dead_letter import dead_letter
from schemas.kafka_io import AvroConsumer, AvroProducer


@dataclass
class LoaderStats:
    records: int = 0
    slots_written: int = 0
    rejected: int = 0
    batches: int = 0
    # per record: wall-clock ms when it became readable in Redis minus its window end
    latencies_ms: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class LoaderConfig:
    bootstrap: str
    topic: str
    dead_letter_topic: str
    group_id: str
    batch: int = 20_000
    partitions: int = 2
    isolation_level: str = "read_committed"
    # a poll returns after this long with what has arrived: a record waits at most that long for Redis
    poll_timeout_s: float = 0.05

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LoaderConfig:
        k, f = settings.kafka, settings.flink
        return replace(cls(k.bootstrap_servers, k.topics.features, k.topics.dead_letter, f.loader_group_id,
                           f.loader_batch, k.partitions, f.loader_isolation), **overrides)


def run_loader(config: LoaderConfig, store: FeatureWriter, should_stop: Callable[[], bool] = lambda: False,
               idle_exit_s: float | None = None, on_batch: Callable[[LoaderStats], None] | None = None) -> LoaderStats:
    """Consumes until `should_stop()` or `idle_exit_s` without records. Order per batch: undecodable
    records to the dead-letter topic, good ones to Redis (one pipeline), then the offsets committed.
    A backlog comes in full batches."""
    c = config
    ensure_topics(c.bootstrap, [c.topic], c.partitions)
    consumer = AvroConsumer(c.bootstrap, c.group_id, [c.topic], "FeatureRecord", isolation_level=c.isolation_level,
                            **{"fetch.min.bytes": 1, "fetch.wait.max.ms": 50})
    dead = AvroProducer(producer_config(c.bootstrap, linger_ms=5), c.dead_letter_topic, "DeadLetter")
    stats = LoaderStats()
    last = time.monotonic()
    try:
        while not should_stop():
            got = consumer.poll_batch(max_records=c.batch, timeout_s=c.poll_timeout_s)
            if got.records:
                stats.slots_written += store.write_batch(got.records)
                readable_at = int(time.time() * 1000)
                stats.latencies_ms.extend(readable_at - r["window_end"] for r in got.records)
                stats.records += len(got.records)
                stats.batches += 1
            if got.rejected:
                now = int(time.time() * 1000)
                for reject in got.rejected:
                    dead.produce(dead_letter("redis-loader", reject, now))
                dead.flush()
                stats.rejected += len(got.rejected)
            if got.offsets:
                consumer.commit()
                last = time.monotonic()
                if on_batch is not None:
                    on_batch(stats)
            elif idle_exit_s is not None and time.monotonic() - last > idle_exit_s:
                break
    finally:
        consumer.close()
    return stats
