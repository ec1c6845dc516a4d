"""Faults injected into the loader's Redis, a real redis-server of the test's own, compared with an
uninterrupted load of the same features topic: the same value in every slot, nothing lost."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.kafka import ensure_topics, producer_config
from core.settings import ServicesSettings, Settings
from feature_store.loader import LoaderConfig, LoaderError, LoaderStats, run_loader
from feature_store.redis_store import RedisFeatureStore
from rtrec.services.redis_server import RedisServer
from schemas.kafka_io import AvroProducer
from tests.feature_store.test_loader import record
from tests.infra import free_port

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(ServicesSettings(state_dir=tmp_path / "state", redis_port=free_port()))
    server.start()
    yield server
    if server.pid() is not None:
        server.stop()


def produce_features(s: Settings, n_entities: int, windows: int) -> None:
    ensure_topics(s.kafka.bootstrap_servers, [s.kafka.topics.features], partitions=2)
    producer = AvroProducer(producer_config(s.kafka.bootstrap_servers), s.kafka.topics.features, "FeatureRecord")
    for w in range(1, windows + 1):
        for e in range(n_entities):
            r = record(f"u{e}", 3000 * w, clicks=(e * w) % 7)
            producer.produce(r, key=r["entity_id"])
    producer.flush()


def contents(client: redis.Redis, prefix: str) -> dict[bytes, dict[bytes, bytes]]:
    return {k.removeprefix(prefix.encode()): client.hgetall(k) for k in client.scan_iter(f"{prefix}:f:*", count=5000)}


def test_kill_9_of_redis_while_loading_ends_in_the_same_state(settings: Settings, own_redis: RedisServer) -> None:
    s = settings
    produce_features(s, n_entities=2000, windows=15)  # 30,000 records
    reference = RedisFeatureStore(s.redis.url, s.redis.key_prefix + "-ref", 3600)
    config = LoaderConfig.from_settings(s, group_id=f"ref-{s.redis.key_prefix}", batch=500)
    assert run_loader(config, reference, idle_exit_s=3.0).records == 30_000

    store = RedisFeatureStore(own_redis.url, s.redis.key_prefix, 3600)
    killed: list[int] = []
    restarted = threading.Event()

    def kill_midway(stats: LoaderStats) -> None:
        if stats.records >= 10_000 and not killed:  # right after a write: its last second is not on disk yet
            killed.append(own_redis.pid() or 0)
            os.kill(killed[0], signal.SIGKILL)

    def restart_after_kill() -> None:
        while not killed:
            time.sleep(0.01)
        time.sleep(1.0)
        own_redis.start()  # replays its append-only file
        restarted.set()

    restarter = threading.Thread(target=restart_after_kill)
    restarter.start()
    faulty = LoaderConfig.from_settings(s, group_id=f"faulty-{s.redis.key_prefix}", batch=500)
    stats = run_loader(faulty, store, idle_exit_s=4.0, on_batch=kill_midway)
    restarter.join()
    assert killed and restarted.is_set()
    assert stats.records > 30_000  # what was written after the last commit was written again
    expected = contents(reference.client, s.redis.key_prefix + "-ref")
    assert len(expected) == 2000
    assert contents(store.client, s.redis.key_prefix) == expected


def test_an_outage_longer_than_its_bound_ends_the_loader_with_the_cause(settings: Settings,
                                                                         own_redis: RedisServer) -> None:
    produce_features(settings, n_entities=100, windows=2)
    own_redis.stop()
    config = LoaderConfig.from_settings(settings, group_id=f"down-{settings.redis.key_prefix}", outage_s=2.0)
    began = time.monotonic()
    with pytest.raises(LoaderError, match="writing to Redis failed for 2 s, giving up: .*Connection refused"):
        run_loader(config, RedisFeatureStore(own_redis.url, settings.redis.key_prefix, 3600), idle_exit_s=10.0)
    assert time.monotonic() - began < 15


def test_rebuild_reloads_everything_after_redis_is_lost(settings: Settings, own_redis: RedisServer) -> None:
    produce_features(settings, n_entities=500, windows=3)
    store = RedisFeatureStore(own_redis.url, settings.redis.key_prefix, 3600)
    config = LoaderConfig.from_settings(settings, group_id=f"rebuild-{settings.redis.key_prefix}")
    run_loader(config, store, idle_exit_s=3.0)
    before = contents(store.client, settings.redis.key_prefix)
    store.client.flushall()  # Redis lost (a disk replaced, a new instance): the group's offsets are at the end
    assert run_loader(config, store, idle_exit_s=3.0).records == 0
    assert run_loader(LoaderConfig.from_settings(settings, group_id=config.group_id, from_beginning=True), store,
                      idle_exit_s=3.0).records == 1500
    assert contents(store.client, settings.redis.key_prefix) == before
