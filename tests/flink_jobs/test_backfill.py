"""Backfill: the job bounded over a time range of the topic, stopping by itself, without clobbering
newer values in Redis."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from feature_store.redis_store import RedisFeatureStore
from rtrec.cli.main import cli
from rtrec.settings import Settings
from schemas.kafka_io import read_topic
from tests.flink_jobs.harness import T, create_topics, event, job_settings, produce

pytestmark = pytest.mark.integration


def test_backfill_time_range(settings: Settings) -> None:
    s = job_settings(settings)
    create_topics(s, partitions=2)
    inside = [event(f"a{k}", "impression", f"u{k % 2}", "i1", 500 * k) for k in range(12)]
    after = [event(f"b{k}", "impression", "u5", "i5", 120_000 + 500 * k) for k in range(5)]
    produce(s, inside + after)
    store = RedisFeatureStore(s.redis.url, s.redis.key_prefix, 600)
    newer = {"entity_type": "user", "entity_id": "u0", "horizon_s": 3, "window_start": T + 10**9,
             "window_end": T + 10**9 + 3000, "impressions": 42, "clicks": 0, "likes": 0, "carts": 0, "orders": 0,
             "ctr": 0.0, "dwell_sum_ms": 0, "dwell_mean_ms": 0.0, "distinct_counterparts": 1}
    store.write_batch([newer])

    env = {"RTREC_KAFKA__BOOTSTRAP_SERVERS": s.kafka.bootstrap_servers, "RTREC_REDIS__URL": s.redis.url,
           "RTREC_REDIS__KEY_PREFIX": s.redis.key_prefix, "RTREC_FLINK__HORIZONS_S": "[6]",
           "RTREC_FLINK__HORIZON_SLIDES_S": "[3]", "RTREC_FLINK__CHECKPOINT_INTERVAL_MS": "1000",
           "RTREC_FLINK__LOADER_GROUP_ID": f"loader-{s.redis.key_prefix}",
           **{f"RTREC_KAFKA__TOPICS__{k.upper()}": v for k, v in s.kafka.topics.model_dump().items()}}
    result = CliRunner().invoke(cli, ["features", "backfill", "--from", str(T), "--to", str(T + 60_000),
                                      "--no-samples"], env=env)
    assert result.exit_code == 0, result.output
    assert "backfill finished" in result.output

    features = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.features, "FeatureRecord").records
    assert features and all(r["window_start"] < T + 60_000 for r in features)
    assert not any(r["entity_id"] == "u5" for r in features)  # after the range
    u1 = [r for r in features if (r["entity_id"], r["horizon_s"], r["window_start"]) == ("u1", 3, T)]
    assert len(u1) == 1 and u1[0]["impressions"] == 3  # a1, a3, a5 in [T, T+3s)
    got = store.get_online_features("user", ["u0", "u1"], ["3s.impressions"])
    # u0: the newer live value is kept; u1: a7, a9, a11 in [T+3s, T+6s)
    assert got.values.tolist() == [[42.0], [3.0]]
    assert got.window_end_ms.tolist() == [[T + 10**9 + 3000], [T + 6000]]
