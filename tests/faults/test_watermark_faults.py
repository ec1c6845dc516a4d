"""Lateness is judged per partition: a backlog over two partitions read at different speeds, by a
live job on a machine whose two cores are busy with something else, dead-letters no on-time event,
and closes the same windows as a bounded run of the same events (which cannot judge anything late)."""

from __future__ import annotations

import contextlib
import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from core.kafka import producer_config
from core.log_range import LogRange
from core.settings import Settings
from flink_jobs.runner import start_job
from schemas.kafka_io import read_topic
from schemas.serde import serializer
from tests.flink_jobs.harness import T, create_topics, event, job_settings, running_job, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SPAN_MS = 240_000
# Partition 1 holds eight times the events of partition 0 over the same four minutes: read from a
# backlog, partition 0 reaches minute four while partition 1 is still in minute one.
SPARSE = [event(f"p0-{k}", "click" if k % 4 == 0 else "impression", f"u{k % 7}", f"i{k % 5}", 80 * k)
          for k in range(SPAN_MS // 80)]
DENSE = [event(f"p1-{k}", "click" if k % 9 == 0 else "impression", f"v{k % 11}", f"i{k % 13}", 10 * k)
         for k in range(SPAN_MS // 10)]
# one event per partition far ahead closes every window of the four minutes
FLUSH = [event(f"flush-{p}", "impression", "w", "i0", SPAN_MS + 30_000) for p in (0, 1)]


def produce_to(settings: Settings, partition: int, events: list[dict]) -> None:
    encode = serializer("InteractionEvent")
    producer = Producer(producer_config(settings.kafka.bootstrap_servers))
    for e in events:
        producer.produce(settings.kafka.topics.events, value=encode(e), key=e["user_id"].encode(),
                         partition=partition, headers=encode.headers, timestamp=e["event_time"])
        producer.poll(0)
    assert producer.flush(30) == 0


def backlog(settings: Settings, run: str, tmp_path: Path) -> Settings:
    s = job_settings(settings.namespaced(f"{run}-{uuid.uuid4().hex[:6]}"), checkpoint_dir=tmp_path / run)
    create_topics(s, partitions=2)
    produce_to(s, 0, [*SPARSE, FLUSH[0]])
    produce_to(s, 1, [*DENSE, FLUSH[1]])
    return s


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def cpu_hog(cores: int) -> Iterator[None]:
    """Busy processes, one per core, competing with the job for the whole block."""
    hogs = [multiprocessing.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(cores)]
    for p in hogs:
        p.start()
    try:
        yield
    finally:
        for p in hogs:
            p.kill()
            p.join()


def windows(records: list[dict]) -> list[tuple]:
    """The windows of the four minutes (the bounded run also closes those holding only the flush)."""
    return sorted((r["entity_type"], r["entity_id"], r["horizon_s"], r["window_start"], r["impressions"],
                   r["clicks"]) for r in records if r["window_start"] < T + SPAN_MS and r["horizon_s"] > 0)


def test_a_skewed_backlog_under_a_cpu_hog_dead_letters_no_on_time_event(settings: Settings, tmp_path: Path) -> None:
    bounded = backlog(settings, "bounded", tmp_path)
    start_job(bounded, resume=False, log_range=LogRange(), with_samples=False).wait()
    k = bounded.kafka
    expected = windows(read_topic(k.bootstrap_servers, k.topics.features, "FeatureRecord").records)
    assert read_topic(k.bootstrap_servers, k.topics.dead_letter, "DeadLetter").records == []
    assert len(expected) > 1000

    live = backlog(settings, "live", tmp_path)
    # with the samples as well, the heavier job the demo runs: with the former 5 s idle timeout and 1 MB
    # fetches, partition 0's first event was already late (partition 1's whole backlog came first)
    with cpu_hog(2), running_job(live, with_samples=True):
        got = wait_for(live, live.kafka.topics.features, "FeatureRecord", timeout_s=300,
                       done=lambda batch: len(windows(batch.records)) >= len(expected))
    dead = read_topic(live.kafka.bootstrap_servers, live.kafka.topics.dead_letter, "DeadLetter").records
    assert [(d["source_partition"], d["source_offset"], d["reason"]) for d in dead][:5] == []
    assert windows(got.records) == expected
