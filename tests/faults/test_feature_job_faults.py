"""Poison input for the feature job (embedded Flink, real broker and Redis), compared with a run of
the same good events without it: one dead letter, and the same windows in Kafka and Redis."""

from __future__ import annotations

import os
import uuid

import pytest
import redis
from confluent_kafka import Producer

from core.log_range import LogRange
from core.settings import Settings
from feature_store.loader import LoaderConfig, run_loader
from feature_store.redis_store import RedisFeatureStore
from flink_jobs.runner import start_job
from schemas.kafka_io import read_topic
from schemas.serde import serializer
from tests.flink_jobs.harness import create_topics, event, job_settings, produce

pytestmark = [pytest.mark.integration, pytest.mark.faults]

GOOD = [event(f"e{k}", "click" if k % 5 == 0 else "impression", f"u{k % 13}", f"i{k % 7}", 250 * k)
        for k in range(240)]  # a minute of events


def run(settings: Settings, poison: bytes | None) -> tuple[list[tuple], list[dict], dict]:
    s = job_settings(settings.namespaced(uuid.uuid4().hex[:8]))
    create_topics(s)
    produce(s, GOOD[:120])
    if poison is not None:
        raw = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
        raw.produce(s.kafka.topics.events, value=poison, key=b"u1",
                    headers=[("rtrec-schema", serializer("InteractionEvent").headers[0][1])])
        raw.flush(10)
    produce(s, GOOD[120:])
    start_job(s, resume=False, log_range=LogRange(), with_samples=False).wait()  # bounded: ends by itself
    k = s.kafka
    features = read_topic(k.bootstrap_servers, k.topics.features, "FeatureRecord").records
    dead = read_topic(k.bootstrap_servers, k.topics.dead_letter, "DeadLetter").records
    store = RedisFeatureStore(s.redis.url, s.redis.key_prefix, 3600)
    run_loader(LoaderConfig.from_settings(s, isolation_level="read_committed"), store, idle_exit_s=2.0)
    client = redis.Redis.from_url(s.redis.url)
    prefix = s.redis.key_prefix.encode()
    in_redis = {key.removeprefix(prefix): client.hgetall(key) for key in client.scan_iter(f"{s.redis.key_prefix}:f:*")}
    windows = sorted((r["entity_type"], r["entity_id"], r["horizon_s"], r["window_start"], r["impressions"],
                      r["clicks"]) for r in features)
    return windows, dead, in_redis


def test_a_poison_record_among_good_ones_costs_one_dead_letter_and_nothing_else(settings: Settings) -> None:
    clean_windows, clean_dead, clean_redis = run(settings, poison=None)
    # 64 bytes whose first string claims 2 GiB: it once made the decoder allocate it (OutOfMemoryError),
    # and the job restarted on it forever
    poison = bytes.fromhex("feffffff0f") + os.urandom(59)
    windows, dead, in_redis = run(settings, poison=poison)
    assert clean_dead == [] and len(clean_windows) > 100
    assert [(d["stage"], d["value"]) for d in dead] == [("feature-job", poison)]
    assert "a string of 2147483647 bytes, but only" in dead[0]["reason"]
    assert windows == clean_windows
    assert in_redis == clean_redis and len(in_redis) > 20
