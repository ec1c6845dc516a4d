"""Backfill: the job bounded over a time range of the topic, stopping by itself, without clobbering
newer values in Redis; with --train, a model learnt from the range's samples in a store of its own,
the live model pointer and live topics untouched."""

from __future__ import annotations

import re

import pytest
import redis
from click.testing import CliRunner

from core.settings import Settings
from feature_store.redis_store import RedisFeatureStore
from gpu_trainer.model_registry import model_pointer_key
from gpu_trainer.snapshots import SnapshotStore
from rtrec.cli.main import cli
from schemas.kafka_io import read_topic
from tests.flink_jobs.harness import T, create_topics, event, job_settings, produce

pytestmark = pytest.mark.integration


def _env(s: Settings, short_horizons: bool = True) -> dict[str, str]:
    # features alone run faster with one 6 s horizon (hopping by the base window); samples keep the feature set's
    horizons = {"RTREC_FLINK__HORIZONS_S": "[6]"} if short_horizons else {}
    return {"RTREC_KAFKA__BOOTSTRAP_SERVERS": s.kafka.bootstrap_servers, "RTREC_REDIS__URL": s.redis.url,
            "RTREC_REDIS__KEY_PREFIX": s.redis.key_prefix, **horizons, "RTREC_FLINK__CHECKPOINT_INTERVAL_MS": "1000",
            "RTREC_FLINK__ATTRIBUTION_WINDOW_S": "5", "RTREC_TRAINER__SNAPSHOT_DIR": str(s.trainer.snapshot_dir),
            "RTREC_TRAINER__BATCH_SIZE": "64", "RTREC_TRAINER__BATCH_TIMEOUT_MS": "200",
            "RTREC_TRAINER__USER_BUCKETS": "1024", "RTREC_TRAINER__ITEM_BUCKETS": "1024",
            **{f"RTREC_KAFKA__TOPICS__{k.upper()}": v for k, v in s.kafka.topics.model_dump().items()}}


def test_backfill_time_range(settings: Settings) -> None:
    s = job_settings(settings)
    create_topics(s, partitions=2)
    inside = [event(f"a{k}", "impression", f"u{k % 2}", "i1", 500 * k) for k in range(12)]
    after = [event(f"b{k}", "impression", "u5", "i5", 120_000 + 500 * k) for k in range(5)]
    produce(s, inside + after)
    store = RedisFeatureStore(s.redis.url, s.redis.key_prefix, 600)
    newer = {"entity_type": "user", "entity_id": "u0", "horizon_s": 3, "window_start": T + 10**9,
             "window_end": T + 10**9 + 3000, "impressions": 42, "clicks": 0, "likes": 0, "carts": 0, "orders": 0,
             "ctr": 0.0, "dwell_sum_ms": 0, "dwell_mean_ms": 0.0, "distinct_counterparts": 1, "dwell_count": 0}
    store.write_batch([newer])

    result = CliRunner().invoke(cli, ["features", "backfill", "--from", str(T), "--to", str(T + 60_000),
                                      "--no-samples"], env={**_env(s), "RTREC_FLINK__PROGRESS_EVERY_S": "1"})
    assert result.exit_code == 0, result.output
    # while the job runs, how far it has read: of the range's 12 records, never more
    progress = [int(n) for n in re.findall(r"job running for \d+ s: (\d+) of 12 events read", result.output)]
    assert progress and max(progress) <= 12, result.output
    topic = re.search(r"features topic (\S+?)[;,\s]", result.output + " ")
    assert topic and topic.group(1).startswith(s.kafka.topics.features + ".backfill-"), result.output

    features = read_topic(s.kafka.bootstrap_servers, topic.group(1), "FeatureRecord").records
    assert features and all(r["window_start"] < T + 60_000 for r in features)
    assert not any(r["entity_id"] == "u5" for r in features)  # after the range
    u1 = [r for r in features if (r["entity_id"], r["horizon_s"], r["window_start"]) == ("u1", 3, T)]
    assert len(u1) == 1 and u1[0]["impressions"] == 3  # a1, a3, a5 in [T, T+3s)
    assert not read_topic(s.kafka.bootstrap_servers, s.kafka.topics.features, "FeatureRecord").records  # live topic
    got = store.get_online_features("user", ["u0", "u1"], ["3s.impressions"])
    # u0: the newer live value is kept; u1: a7, a9, a11 in [T+3s, T+6s)
    assert got.values.tolist() == [[42.0], [3.0]]
    assert got.window_end_ms.tolist() == [[T + 10**9 + 3000], [T + 6000]]


def test_backfill_with_training_leaves_the_live_model_alone(settings: Settings, tmp_path: object) -> None:
    s = job_settings(settings, horizons_s=None)
    s = s.model_copy(update={"trainer": s.trainer.model_copy(update={"snapshot_dir": tmp_path / "snapshots"})})
    create_topics(s, partitions=2)
    events = []
    for k in range(300):  # impressions every 200 ms; users u0-u4 click item i0 a second later
        user, item = f"u{k % 5}", f"i{k % 3}"
        events.append(event(f"m{k}", "impression", user, item, 200 * k))
        if item == "i0":
            events.append(event(f"c{k}", "click", user, item, 200 * k + 1000))
    produce(s, sorted(events, key=lambda e: e["event_time"]))
    live = redis.Redis.from_url(s.redis.url)
    live.set(model_pointer_key(s.redis.key_prefix), 7)  # a live model the backfill must not replace

    result = CliRunner().invoke(cli, ["backfill", "--from", str(T), "--to", str(T + 120_000), "--train"],
                                env=_env(s, short_horizons=False))
    assert result.exit_code == 0, result.output
    trained = re.search(r"trained (\d+) samples into (\S+)", result.output)
    assert trained, result.output
    samples = re.search(r"samples topic (\S+?)[;,\s]", result.output + " ")
    assert samples and samples.group(1).startswith(s.kafka.topics.samples + ".backfill-")
    n_samples = len(read_topic(s.kafka.bootstrap_servers, samples.group(1), "TrainingSample").records)
    assert n_samples == 300 and int(trained.group(1)) == n_samples  # one per impression, all trained
    assert not read_topic(s.kafka.bootstrap_servers, s.kafka.topics.samples, "TrainingSample").records

    store = SnapshotStore(tmp_path / trained.group(2).rsplit("/", 1)[1])
    assert store.versions(), "the backfill wrote no snapshot"
    assert store.manifest(store.versions()[-1]).samples_seen == n_samples
    assert not (tmp_path / "snapshots").exists() or not SnapshotStore(tmp_path / "snapshots").versions()
    assert int(live.get(model_pointer_key(s.redis.key_prefix))) == 7


def test_an_empty_range_is_a_clear_error(settings: Settings) -> None:
    s = job_settings(settings)
    create_topics(s, partitions=2)
    produce(s, [event("late", "impression", "u1", "i1", 1000)])
    result = CliRunner().invoke(cli, ["backfill", "--from", str(T + 10**6)], env=_env(s))
    assert result.exit_code == 1 and "the range selects no records of" in result.output, result.output
