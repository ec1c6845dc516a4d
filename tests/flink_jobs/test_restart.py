"""A job stopped and restarted from its checkpoint: no duplicate feature records for a read_committed
consumer, the same features and the same Redis state as an uninterrupted run (also for a loader that
reads uncommitted records, aborted ones included); older windows replayed into Redis change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.kafka import producer_config
from core.settings import Settings
from feature_store.loader import LoaderConfig, run_loader
from feature_store.redis_store import RedisFeatureStore
from flink_jobs.runner import latest_checkpoint
from schemas.kafka_io import AvroProducer, read_topic
from tests.flink_jobs.harness import as_row, create_topics, event, job_settings, produce, running_job, wait_for
from tests.flink_jobs.test_cluster import renamed

pytestmark = pytest.mark.integration

PHASE1 = [event(f"a{k}", "impression", f"u{k % 3}", f"i{k % 4}", 400 * k) for k in range(20)]
# in event-time order: sent after a19 (7,600 ms), the click at 2,000 ms was late or not depending on
# whether a watermark had gone out in between (every 50 ms), and the two runs compared disagreed
PHASE1 += [event("c1", "click", "u1", "i1", 2000, dwell=700), event("w1", "impression", "u0", "i0", 12_000)]
PHASE1.sort(key=lambda e: e["event_time"])
PHASE2 = [event(f"b{k}", "impression", f"u{k % 3}", f"i{k % 5}", 13_000 + 500 * k) for k in range(20)]
PHASE2 += [event("flush", "impression", "u9", "i9", 60_000)]


def window_keys(records: list[dict]) -> list[tuple]:
    return [(r["entity_type"], r["entity_id"], r["horizon_s"], r["window_start"]) for r in records]


def load_into_redis(s: Settings, isolation_level: str = "read_committed") -> dict[bytes, dict]:
    prefix = s.redis.key_prefix + ("" if isolation_level == "read_committed" else "-" + isolation_level)
    store = RedisFeatureStore(s.redis.url, prefix, 600)
    run_loader(LoaderConfig.from_settings(s, group_id=f"loader-{prefix}", partitions=1,
                                          isolation_level=isolation_level), store, idle_exit_s=3.0)
    keys = sorted(store.client.scan_iter(f"{prefix}:f:*"))
    return {k.split(b":f:", 1)[1]: store.client.hgetall(k) for k in keys}


def test_restart_from_checkpoint_is_exactly_once(settings: Settings, tmp_path: Path) -> None:
    base = job_settings(settings)
    straight = renamed(base, "straight").model_copy(update={"flink": base.flink.model_copy(update={
        "checkpoint_dir": tmp_path / "straight", "group_id": "straight-" + base.flink.group_id})})
    interrupted = renamed(base, "restarted").model_copy(update={"flink": base.flink.model_copy(update={
        "checkpoint_dir": tmp_path / "restarted", "group_id": "restarted-" + base.flink.group_id})})
    straight = straight.model_copy(update={"redis": straight.redis.model_copy(
        update={"key_prefix": straight.redis.key_prefix + "-s"})})
    interrupted = interrupted.model_copy(update={"redis": interrupted.redis.model_copy(
        update={"key_prefix": interrupted.redis.key_prefix + "-r"})})
    for s in (straight, interrupted):
        create_topics(s)

    def final(got: object) -> bool:
        return any(r["entity_id"] == "u1" and r["window_start"] >= PHASE2[-2]["event_time"] - 3000
                   for r in got.records)  # type: ignore[attr-defined]

    with running_job(straight, with_samples=False):
        produce(straight, PHASE1 + PHASE2)
        expected = wait_for(straight, straight.kafka.topics.features, "FeatureRecord", final)

    # Checkpoints every 10 s: once the first one has committed phase 1, the first half of phase 2
    # closes windows that are sent (visible to read_uncommitted) and then aborted by the cancel.
    interrupted = interrupted.model_copy(update={"flink": interrupted.flink.model_copy(
        update={"checkpoint_interval_ms": 10_000})})
    half = len(PHASE2) // 2
    topic = interrupted.kafka.topics.features
    with running_job(interrupted, with_samples=False):
        produce(interrupted, PHASE1)
        wait_for(interrupted, topic, "FeatureRecord", lambda got: len(got.records) > 5)
        produce(interrupted, PHASE2[:half])
        wait_for(interrupted, topic, "FeatureRecord", isolation_level="read_uncommitted",
                 done=lambda got: any(r["window_start"] >= PHASE2[0]["event_time"] - 3000 for r in got.records))
    checkpoint = latest_checkpoint(interrupted.flink.checkpoint_dir)
    assert checkpoint is not None
    produce(interrupted, PHASE2[half:])  # arrives while the job is down
    with running_job(interrupted, resume=True, with_samples=False):
        got = wait_for(interrupted, interrupted.kafka.topics.features, "FeatureRecord", final)

    keys = window_keys(got.records)
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    assert sorted(keys) == sorted(window_keys(expected.records))
    assert {as_row(r) for r in got.records} == {as_row(r) for r in expected.records}

    redis_straight, redis_restarted = load_into_redis(straight), load_into_redis(interrupted)
    assert redis_straight and redis_restarted == redis_straight
    aborted = len(read_topic(interrupted.kafka.bootstrap_servers, topic, "FeatureRecord",
                             isolation_level="read_uncommitted").records) - len(got.records)
    assert aborted > 0, "no aborted records: the read_uncommitted case below would prove nothing"
    assert load_into_redis(interrupted, "read_uncommitted") == redis_straight

    # replaying older windows (as a backfill would) leaves Redis unchanged
    producer = AvroProducer(producer_config(interrupted.kafka.bootstrap_servers), interrupted.kafka.topics.features,
                            "FeatureRecord")
    oldest_first = sorted(got.records, key=lambda r: r["window_end"])
    for r in oldest_first[: len(oldest_first) // 2]:
        producer.produce({**r, "impressions": 999})
    producer.flush()
    assert load_into_redis(interrupted) == redis_straight
