"""Running the feature job embedded for a test, and feeding it crafted events."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from core.kafka import ensure_topics, producer_config
from core.settings import Settings
from flink_jobs.runner import start_job
from schemas.kafka_io import AvroProducer, ConsumedBatch, read_topic

T = 1_699_999_998_000  # a multiple of 3000 ms: window edges fall on round offsets from it


def job_settings(settings: Settings, **flink: Any) -> Settings:
    f = settings.flink.model_copy(update={"horizons_s": (6,), "checkpoint_interval_ms": 1000,
                                          "group_id": f"job-{settings.redis.key_prefix}", **flink})
    return settings.model_copy(update={"flink": f})


def as_row(record: dict) -> tuple:
    """A decoded record as a hashable row (its lists as tuples), to compare outputs as sets."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in record.items()))


def event(eid: str, etype: str, user: str, item: str, offset_ms: int, dwell: int | None = None) -> dict:
    return {"event_id": eid, "user_id": user, "item_id": item, "event_type": etype, "event_time": T + offset_ms,
            "dwell_ms": dwell, "position": None, "session_id": None}


def produce(settings: Settings, events: list[dict]) -> None:
    k = settings.kafka
    producer = AvroProducer(producer_config(k.bootstrap_servers, **k.security.librdkafka()), k.topics.events,
                            "InteractionEvent")
    for e in events:
        producer.produce(e, key=e["user_id"], timestamp_ms=e["event_time"])
        producer.flush()  # one by one: arrival order is the test's order


def create_topics(settings: Settings, partitions: int = 1) -> None:
    k = settings.kafka
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), partitions,
                  security=k.security.librdkafka())


@contextlib.contextmanager
def running_job(settings: Settings, resume: bool = False, **build: Any) -> Iterator[Any]:
    result = start_job(settings, resume=resume, **build)
    client = result.get_job_client()
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.cancel().result()


def wait_for(settings: Settings, topic: str, schema_name: str, done: Callable[[ConsumedBatch], bool],
             timeout_s: float = 90.0, isolation_level: str = "read_committed") -> ConsumedBatch:
    deadline = time.monotonic() + timeout_s
    while True:
        got = read_topic(settings.kafka.bootstrap_servers, topic, schema_name, timeout_s=10,
                         isolation_level=isolation_level, security=settings.kafka.security.librdkafka())
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)
