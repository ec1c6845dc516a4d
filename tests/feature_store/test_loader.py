"""The loader against the real broker and Redis: records into Redis, undecodable ones dead-lettered,
offsets committed after the writes."""

from __future__ import annotations

import json
import time

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
    # each record's latency splits at the moment the loader had it: fetched and decoded, then written
    assert len(stats.received_ms) == len(stats.latencies_ms) == 3
    assert all(r <= w for r, w in zip(stats.received_ms, stats.latencies_ms, strict=True))
    assert 0 < stats.write_cpu_s <= stats.write_s
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


def test_the_coordinator_tells_a_consumer_left_out_of_its_group_from_one_without_partitions(
        settings: Settings) -> None:
    from confluent_kafka import Consumer as PlainConsumer

    from core.group_watch import GroupWatch
    from core.kafka import consumer_config

    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.features], partitions=1)
    group = f"watch-{settings.redis.key_prefix}"
    members = [PlainConsumer(consumer_config(k.bootstrap_servers, group)) for _ in range(2)]
    left_out = PlainConsumer(consumer_config(k.bootstrap_servers, group))  # never joins: no subscription
    try:
        for consumer in members:
            consumer.subscribe([k.topics.features])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (all(c.memberid() for c in members)
                                                   and sum(len(c.assignment()) for c in members) == 1):
            for consumer in members:
                consumer.poll(0.2)
        holder, idle = sorted(members, key=lambda c: -len(c.assignment()))
        assert holder.assignment() and not idle.assignment() and idle.memberid()
        watch = {c: GroupWatch(k.bootstrap_servers, group, after_s=0.0, every_s=0.0) for c in members + [left_out]}
        verdicts: list[list[bool]] = []
        while time.monotonic() < deadline and not any(v[2] for v in verdicts):  # until the group has settled
            for consumer in members:
                consumer.poll(0.2)
            verdicts.append([watch[c].left_behind(c) for c in (holder, idle, left_out)])
        assert verdicts[-1] == [False, False, True] and len(verdicts) >= 2, verdicts  # two answers in a row count
        assert not any(v[0] or v[1] for v in verdicts), verdicts
    finally:
        for consumer in members + [left_out]:
            consumer.close()


def test_a_consumer_the_group_left_behind_is_replaced_and_nothing_is_lost(settings: Settings,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's lost coordinator cannot be brought about on demand, so the watch's verdict is forced
    once, after the first batch: the loader then reads on with a new consumer from the last commit."""
    import feature_store.loader as loader_module
    from core.group_watch import GroupWatch
    from feature_store.telemetry import LoaderMetrics

    class ForcedOnce(GroupWatch):
        forced = 0

        def left_behind(self, consumer: Consumer) -> bool:
            if ForcedOnce.forced == 0 and consumer.assignment() and stats_seen:
                ForcedOnce.forced = 1
                return True
            return super().left_behind(consumer)

    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.features], partitions=2)
    producer = AvroProducer(producer_config(k.bootstrap_servers), k.topics.features, "FeatureRecord")
    expected = [record(f"u{i % 50}", 3000 * (1 + i // 50), clicks=i % 7) for i in range(2000)]
    for r in expected:
        producer.produce(r, key=r["entity_id"])
    producer.flush()
    monkeypatch.setattr(loader_module, "GroupWatch", ForcedOnce)
    stats_seen: list[int] = []
    metrics = LoaderMetrics()
    config = LoaderConfig.from_settings(settings, batch=300, group_id=f"left-{settings.redis.key_prefix}")
    store = RedisFeatureStore.from_settings(settings.redis, settings.flink)
    stats = run_loader(config, store, idle_exit_s=3.0, metrics=metrics,
                       on_batch=lambda s: stats_seen.append(s.records))

    assert ForcedOnce.forced == 1
    assert metrics.retries.labels(what="rejoining the group")._value.get() == 1
    assert stats.records > len(expected)  # what was not committed yet came again to the new consumer
    newest = {r["entity_id"]: r["clicks"] for r in expected}  # the last window of each user is the newest
    got = store.get_online_features("user", sorted(newest), ["3s.clicks"])
    assert got.values[:, 0].tolist() == [float(newest[u]) for u in sorted(newest)]
    group = Consumer({"bootstrap.servers": k.bootstrap_servers, "group.id": config.group_id})
    partitions = [TopicPartition(k.topics.features, p) for p in range(2)]
    committed = [tp.offset for tp in group.committed(partitions, timeout=10)]
    ends = [group.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions]
    group.close()
    assert committed == ends


def test_records_no_slot_can_hold_are_dead_lettered_and_the_rest_lands_as_without_them(settings: Settings) -> None:
    """Records that decode but cannot be written (a tile that does not divide the horizon it lists, a
    listed horizon of 0 that would overwrite a user's recent list, a window in the far future that would
    win its slot until the TTL, a window ending before it starts) are dead-lettered with their reason;
    the loader goes on, and Redis ends as the good records alone leave it."""
    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.features], partitions=1)
    now = int(time.time() * 1000) // 3000 * 3000
    good = [{**record(u, now - 3000 * j, j), "tile_of_horizons_s": [60]} for j in range(8, 0, -1) for u in ("u1", "u2")]
    good.append({**record("u1", now - 9000, 0), "horizon_s": 0, "window_start": now - 12_000, "recent_items": ["i1"],
                 "recent_types": ["click"], "recent_times_ms": [now - 10_000]})
    poison = [
        ({**record("u1", now - 6000, 5), "tile_of_horizons_s": [10]}, "is no tile of the listed horizon 10 s"),
        ({**record("u1", now - 6000, 5), "tile_of_horizons_s": [60, 0]}, "it lists 0 s as a horizon"),
        ({**record("u2", now + 86_400_000, 7), "tile_of_horizons_s": [60]}, "beyond the future the job accepts"),
        ({**record("u2", now - 3000, 7), "window_start": now}, "the window ends before it starts"),
        ({**record("u1", now - 3000, 7), "horizon_s": 7}, "is no tile of its horizon 7 s"),
    ]
    producer = AvroProducer(producer_config(k.bootstrap_servers), k.topics.features, "FeatureRecord")
    sent = [*good[:5], *(p for p, _ in poison), *good[5:]]  # good records before and after the poison ones
    for r in sent:
        producer.produce(r, key=r["entity_id"])
    producer.flush()

    config = LoaderConfig.from_settings(settings, partitions=1, isolation_level="read_committed")
    store = RedisFeatureStore.from_settings(settings.redis, settings.flink)
    stats = run_loader(config, store, idle_exit_s=2.0)

    assert (stats.records, stats.rejected) == (len(good), len(poison))
    dead = read_topic(k.bootstrap_servers, k.topics.dead_letter, "DeadLetter").records
    assert len(dead) == len(poison) and {d["stage"] for d in dead} == {"redis-loader"}
    for p, reason in poison:  # the dead-letter topic's partitions need not keep their order
        key = f"feature:user:{p['entity_id']}:{p['horizon_s']}s:{p['window_end']}".encode()
        assert [d["key"] for d in dead if reason in d["reason"]] == [key]
    expected = RedisFeatureStore(settings.redis.url, f"{settings.redis.key_prefix}-expected", settings.redis.ttl_s,
                                 tiles_s=store.tiles_s)
    expected.write_batch(good)

    def state(prefix: str) -> dict:
        return {key[len(prefix):]: store.client.hgetall(key) for key in store.client.scan_iter(f"{prefix}:*")}

    assert state(store.prefix) == state(expected.prefix) != {}
    assert store.get_recent_engagements(["u1"])[0].items == ["i1"]  # type: ignore[union-attr]
    group = Consumer({"bootstrap.servers": k.bootstrap_servers, "group.id": config.group_id})
    committed = group.committed([TopicPartition(k.topics.features, 0)], timeout=10)
    group.close()
    assert committed[0].offset == len(sent)
