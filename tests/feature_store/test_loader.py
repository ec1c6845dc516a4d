"""The loader against the real broker and Redis: records into Redis, undecodable ones dead-lettered,
offsets committed after the writes."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from core.kafka import ensure_topics, producer_config
from core.settings import Settings
from feature_store.loader import LoaderConfig, run_loader
from feature_store.redis_store import RedisFeatureStore
from schemas.kafka_io import AvroProducer, read_topic

pytestmark = pytest.mark.integration


def record(entity: str, window_end: int, clicks: int) -> dict:
    return {"entity_type": "user", "entity_id": entity, "horizon_s": 3, "window_start": window_end - 3000,
            "window_end": window_end, "impressions": 10, "clicks": clicks, "likes": 0, "carts": 0, "orders": 0,
            "ctr": clicks / 10, "dwell_sum_ms": 0.0, "dwell_mean_ms": 0.0, "distinct_counterparts": 2, "dwell_count": 0}


def test_loads_records_dead_letters_the_undecodable_and_commits(settings: Settings) -> None:
    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.features], partitions=1)
    producer = AvroProducer(producer_config(k.bootstrap_servers), k.topics.features, "FeatureRecord")
    for r in [record("u1", 6000, 1), record("u1", 3000, 9), record("u2", 6000, 2)]:
        producer.produce(r, key=r["entity_id"])
    producer.flush()
    raw = Producer({"bootstrap.servers": k.bootstrap_servers})
    raw.produce(k.topics.features, value=b"\x00junk")
    raw.flush(10)

    config = LoaderConfig.from_settings(settings, partitions=1, isolation_level="read_committed")
    store = RedisFeatureStore.from_settings(settings.redis, settings.flink)
    stats = run_loader(config, store, idle_exit_s=2.0)

    assert (stats.records, stats.rejected) == (3, 1)
    got = store.get_online_features("user", ["u1", "u2"], ["3s.clicks"])
    assert got.values[:, 0].tolist() == [1.0, 2.0]  # u1's older window did not overwrite the newer one
    dead = read_topic(k.bootstrap_servers, k.topics.dead_letter, "DeadLetter").records
    assert [(d["stage"], d["source_offset"]) for d in dead] == [("redis-loader", 3)]
    group = Consumer({"bootstrap.servers": k.bootstrap_servers, "group.id": config.group_id})
    committed = group.committed([TopicPartition(k.topics.features, 0)], timeout=10)
    group.close()
    assert committed[0].offset == 4


def test_features_status_shows_the_loaders_lag(settings: Settings) -> None:
    from click.testing import CliRunner

    from rtrec.cli.main import cli

    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.features, k.topics.events], partitions=1)
    producer = AvroProducer(producer_config(k.bootstrap_servers), k.topics.features, "FeatureRecord")
    for r in [record("u1", 3000, 1), record("u2", 3000, 2), record("u3", 3000, 3)]:
        producer.produce(r, key=r["entity_id"])
    producer.flush()
    env = {"RTREC_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers, "RTREC_KAFKA__TOPICS__FEATURES": k.topics.features,
           "RTREC_KAFKA__TOPICS__EVENTS": k.topics.events, "RTREC_REDIS__URL": settings.redis.url,
           "RTREC_REDIS__KEY_PREFIX": settings.redis.key_prefix,
           "RTREC_FLINK__LOADER_GROUP_ID": f"status-{settings.redis.key_prefix}"}

    def loader_lag() -> int:
        result = CliRunner().invoke(cli, ["features", "status"], env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["loader"]["total_lag"]

    assert loader_lag() == 3
    loaded = CliRunner().invoke(cli, ["features", "load", "--idle-exit", "2"], env=env)
    assert loaded.exit_code == 0 and "loaded 3 feature records" in loaded.output, loaded.output
    assert loader_lag() == 0


def test_the_loader_exports_its_metrics(settings: Settings) -> None:
    import urllib.request

    from feature_store.telemetry import LoaderMetrics
    from tests.infra import free_port

    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.features], partitions=1)
    producer = AvroProducer(producer_config(k.bootstrap_servers), k.topics.features, "FeatureRecord")
    for r in [record("u1", 3000, 1), record("u2", 3000, 2)]:
        producer.produce(r, key=r["entity_id"])
    producer.flush()
    raw = Producer({"bootstrap.servers": k.bootstrap_servers})
    raw.produce(k.topics.features, value=b"\x00")
    raw.flush(10)
    metrics, port = LoaderMetrics(), free_port()
    metrics.serve(port)
    config = LoaderConfig.from_settings(settings, partitions=1, group_id=f"metrics-{settings.redis.key_prefix}")
    store = RedisFeatureStore.from_settings(settings.redis, settings.flink)
    run_loader(config, store, idle_exit_s=2.0, metrics=metrics)
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in scraped.splitlines()
              if line.startswith("rtrec_loader_") and " " in line}
    assert values["rtrec_loader_records_total"] == 2 and values["rtrec_loader_slots_written_total"] == 2
    assert values["rtrec_loader_dead_lettered_total"] == 1
    assert values["rtrec_loader_consumer_lag"] == 0
    assert 'rtrec_loader_freshness_seconds{quantile="1"}' in values
