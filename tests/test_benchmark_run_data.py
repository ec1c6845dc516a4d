"""The benchmarks remove what their isolated runs left on the shared Kafka and Redis, and nothing else."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient

from benchmarks.run_data import remove_runs, tracked
from core.kafka import delete_topics, ensure_topics
from core.settings import Settings

pytestmark = pytest.mark.integration


def _topics(s: Settings) -> set[str]:
    return set(AdminClient({"bootstrap.servers": s.kafka.bootstrap_servers}).list_topics(timeout=10).topics)


def test_a_runs_topics_keys_and_directory_are_removed_and_another_runs_are_kept(settings: Settings,
                                                                                tmp_path: Path) -> None:
    run_id = f"r{uuid.uuid4().hex[:6]}"
    run, other = settings.namespaced(run_id), settings.namespaced(f"{run_id}x")  # one id the other's prefix
    own_sink = f"{run.kafka.topics.features}.a3c"  # as a benchmark's sinks of their own are named
    ensure_topics(settings.kafka.bootstrap_servers,
                  [run.kafka.topics.events, run.kafka.topics.features, own_sink, other.kafka.topics.features])
    client = redis.Redis.from_url(settings.redis.url)
    client.hset(f"{run.redis.key_prefix}:f:user:u1", "a", "1")
    client.set(f"{run.redis.key_prefix}:progress", "1")
    client.hset(f"{other.redis.key_prefix}:f:user:u1", "a", "1")
    directory = tmp_path / "checkpoints"
    (directory / "chk-1").mkdir(parents=True)

    tracked(run, run_id, directory)
    remove_runs()

    gone = {run.kafka.topics.events, run.kafka.topics.features, own_sink}
    deadline = time.monotonic() + 30
    while gone & _topics(settings) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not gone & _topics(settings)
    assert delete_topics(settings.kafka.bootstrap_servers, sorted(gone)) == {}  # already gone: deleted
    assert other.kafka.topics.features in _topics(settings)
    assert list(client.scan_iter(f"{run.redis.key_prefix}:*")) == []
    assert client.hget(f"{other.redis.key_prefix}:f:user:u1", "a") == b"1"
    assert not directory.exists()
