"""Training samples from the feature job: labels within the attribution window, point-in-time features."""

from __future__ import annotations

import random
import time
import uuid

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from core.kafka import consumer_config
from core.settings import Settings
from feature_store.loader import LoaderConfig, run_loader
from feature_store.redis_store import RedisFeatureStore
from flink_jobs.monitor import FlinkRest, mini_cluster_rest_url
from schemas.feature_set import FEATURE_NAMES, HORIZONS_S
from schemas.kafka_io import read_topic
from schemas.serde import header_of
from tests.flink_jobs.harness import T, create_topics, event, job_settings, produce, running_job, wait_for

pytestmark = pytest.mark.integration


# 4: the samples in TrainingSampleBlocks of up to four, read back as the samples they hold
@pytest.mark.parametrize("per_message", [1, 4])
def test_labels_and_point_in_time_features(settings: Settings, per_message: int) -> None:
    s = job_settings(settings, horizons_s=None, attribution_window_s=5, history_length=3, history_lookback_s=10,
                     samples_per_message=per_message)
    create_topics(s)
    events = [
        event("a1", "impression", "u1", "i1", 100), event("a2", "click", "u1", "i1", 200),
        event("a3", "impression", "u1", "i2", 3100),
        event("p", "impression", "u1", "i1", 6000),
        event("c_at", "click", "u1", "i1", 6000),  # same instant as p: not in p's features, not its label
        event("c_after", "like", "u1", "i1", 7000),  # within 5 s after p: p is positive
        event("q", "impression", "u2", "i3", 6500),
        # u3's history: the newest three, ties in time by item, nothing at or after the impression
        event("h1", "click", "u3", "i1", 8100), event("h2", "like", "u3", "i2", 9000),
        event("h4", "click", "u3", "i4", 10_000), event("h3", "cart", "u3", "i3", 10_000),
        event("h5", "order", "u3", "i5", 11_000),
        event("r", "impression", "u3", "i9", 13_000), event("h6", "click", "u3", "i6", 13_000),
        event("old", "impression", "u3", "i9", 22_000),  # 10 s lookback: only h6 is recent enough
        event("flush", "impression", "u9", "i9", 120_000),
    ]
    with running_job(s):
        produce(s, events)
        got = wait_for(s, s.kafka.topics.samples, "TrainingSample", lambda got: len(got.records) >= 6)
        features = wait_for(s, s.kafka.topics.features, "FeatureRecord",
                            lambda got: len([r for r in got.records if r["horizon_s"] == 0]) >= 5)
    check_recent_lists(s, features.records)
    samples = {r["sample_id"]: r for r in got.records}
    assert set(samples) == {"a1", "a3", "p", "q", "r", "old"}  # flush's attribution window is still open
    def history(sample_id: str) -> list[tuple[str, str, int]]:
        r = samples[sample_id]
        return list(zip(r["recent_items"], r["recent_types"], r["recent_ages_ms"], strict=True))
    assert history("r") == [("i5", "order", 2000), ("i3", "cart", 3000), ("i4", "click", 3000)]
    assert history("old") == [("i6", "click", 9000)]
    assert history("p") == [("i1", "click", 5800)]  # not c_at, at the same instant
    assert history("a3") == [("i1", "click", 2900)] and history("a1") == [] and history("q") == []
    p = samples["p"]
    assert p["label"] == 1 and p["user_id"] == "u1" and p["event_time"] == T + 6000
    features = dict(zip(FEATURE_NAMES, p["features"], strict=True))
    # user u1 over the 60 s window ending exactly at T+6000: a1, a2, a3, not the click at T+6000
    assert (features["user.60s.impressions"], features["user.60s.clicks"], features["user.60s.ctr"]) == (2, 1, 0.5)
    # the 600 s horizon slides by 30 s: its newest closed window (end T-18000) holds none of it yet
    assert features["user.600s.impressions"] == 0
    assert (features["item.60s.impressions"], features["item.60s.clicks"], features["item.60s.ctr"]) == (1, 1, 1.0)
    assert samples["q"]["label"] == 0 and set(samples["q"]["features"]) == {0.0}
    assert samples["a1"]["label"] == 1  # a2 clicked 100 ms later
    assert samples["a3"]["label"] == 0
    a3 = dict(zip(FEATURE_NAMES, samples["a3"]["features"], strict=True))
    assert a3["user.60s.impressions"] == 1 and a3["user.60s.clicks"] == 1  # window ending T+3000


def hopping_window_features(events: list[dict], t: int, entity: str, key: str, horizon_s: int,
                            slide_s: int) -> dict[str, float]:
    """What a hopping window gives an impression at `t`: the window ending at the newest slide
    boundary at or before t, over the entity's events (the definition the job's tiles must equal)."""
    end = t - t % (slide_s * 1000)
    mine = [e for e in events if e[f"{entity}_id"] == key and end - horizon_s * 1000 <= e["event_time"] < end]
    imps = sum(e["event_type"] == "impression" for e in mine)
    clicks = sum(e["event_type"] == "click" for e in mine)
    dwells = [e["dwell_ms"] for e in mine if e["dwell_ms"] is not None]
    return {"impressions": imps, "clicks": clicks, "likes": sum(e["event_type"] == "like" for e in mine),
            "ctr": clicks / imps if imps else 0.0, "dwell_mean_ms": sum(dwells) / len(dwells) if dwells else 0.0}


@pytest.mark.parametrize("per_message", [1, 64])
def test_sample_features_equal_hopping_windows_over_a_random_stream(settings: Settings, per_message: int) -> None:
    """Every sample's 20 features, computed by the job from tiles, against hopping windows computed here
    from the same events: 900 events of 4 users and 5 items over 12 minutes, in time order. In blocks
    of up to 64 samples too (cut by size and by checkpoints), each sample once all the same."""
    s = job_settings(settings, horizons_s=None, attribution_window_s=5, samples_per_message=per_message)
    create_topics(s)
    rng = random.Random(7)
    times = sorted(rng.randrange(0, 720_000) for _ in range(900))
    kinds = rng.choices(["impression", "click", "like", "cart"], weights=[6, 2, 1, 1], k=len(times))
    events = [event(f"e{n}", kind, f"u{rng.randrange(4)}", f"i{rng.randrange(5)}", at,
                    dwell=rng.randrange(100, 5000) if kind == "click" and rng.random() < 0.7 else None)
              for n, (at, kind) in enumerate(zip(times, kinds, strict=True))]
    impressions = {e["event_id"]: e for e in events if e["event_type"] == "impression"
                   and e["event_time"] < T + 700_000}  # later ones wait for labels after the flush
    with running_job(s):
        produce(s, [*events, event("flush", "impression", "u9", "i9", 800_000)])
        got = wait_for(s, s.kafka.topics.samples, "TrainingSample",
                       lambda got: set(impressions) <= {r["sample_id"] for r in got.records}, timeout_s=180)
    samples = {r["sample_id"]: r for r in got.records}
    slides = s.flink.horizon_slides_s
    mismatched = []
    for sid, imp in impressions.items():
        features = dict(zip(FEATURE_NAMES, samples[sid]["features"], strict=True))
        for entity in ("user", "item"):
            for h in HORIZONS_S:
                want = hopping_window_features(events, imp["event_time"], entity, imp[f"{entity}_id"], h, slides[h])
                for agg, value in want.items():
                    name = f"{entity}.{h}s.{agg}"
                    if features[name] != float(np.float32(value)):
                        mismatched.append((sid, name, features[name], value))
    assert not mismatched, mismatched[:10]
    assert len(impressions) > 400 and len(got.records) == len(samples)  # each sample once
    kinds = [h.split(b":")[0] for h in schema_headers(s, s.kafka.topics.samples)]
    if per_message == 1:
        assert kinds == [b"TrainingSample"] * len(samples)
    else:  # blocks cut by size or by the checkpoints of the run
        assert set(kinds) == {b"TrainingSampleBlock"} and len(samples) / 64 <= len(kinds) < len(samples) / 4


def schema_headers(s: Settings, topic: str) -> list[bytes]:
    """The schema header of every committed message of `topic`."""
    consumer = Consumer(consumer_config(s.kafka.bootstrap_servers, f"headers-{uuid.uuid4().hex}", "read_committed",
                                        "earliest"))
    try:
        listed = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in listed}
        parts = [p for p, end in ends.items() if end > 0]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                tp.offset < ends[tp.partition] for tp in consumer.position([TopicPartition(topic, p) for p in parts])):
            out += [header_of(m.headers()) or b"" for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
        return out
    finally:
        consumer.close()


def test_an_engagement_behind_the_watermark_in_an_open_window_reaches_windows_and_lists(settings: Settings) -> None:
    """A click 2.5 s behind the newest event is behind the watermark (2 s delay) but its 3 s window is
    still open: the window features count it, so the user's list and the samples must have it too, and
    no operator may drop it uncounted. An impression as late gets its sample, with the list as of its
    own time (the temporal join's late side)."""
    s = job_settings(settings, horizons_s=None, attribution_window_s=5, history_length=3, history_lookback_s=10)
    create_topics(s)
    with running_job(s) as client:
        produce(s, [event("e1", "click", "u1", "i1", 5000), event("x", "impression", "u2", "i2", 9000)])
        time.sleep(2.0)  # the watermark (9000 - 2000) reaches every operator before the late click arrives
        produce(s, [event("late", "click", "u1", "i7", 6500), event("late_imp", "impression", "u1", "i8", 7000),
                    event("after", "click", "u1", "i6", 7500), event("imp", "impression", "u1", "i9", 9500),
                    event("flush", "impression", "u9", "i9", 120_000)])
        got = wait_for(s, s.kafka.topics.samples, "TrainingSample",
                       lambda got: {"x", "late_imp", "imp"} <= {r["sample_id"] for r in got.records})
        features = wait_for(s, s.kafka.topics.features, "FeatureRecord",
                            lambda got: any(r["entity_id"] == "u1" and r["window_end"] == T + 9000
                                            and r["horizon_s"] == 3 for r in got.records))
        rest_url = mini_cluster_rest_url(client)
        assert rest_url is not None
        rest = FlinkRest(rest_url)
        deadline = time.monotonic() + 30
        while (health := rest.health(str(client.get_job_id()))).late_dropped is None \
                and time.monotonic() < deadline:
            time.sleep(1.0)  # the operators' metrics appear once Flink's metric fetcher has seen them
    u1 = next(r for r in features.records if r["entity_id"] == "u1" and r["window_end"] == T + 9000
              and r["horizon_s"] == 3)
    assert (u1["clicks"], u1["impressions"]) == (2, 1)  # late click and impression, then after, in [6000, 9000)
    samples = {r["sample_id"]: r for r in got.records}
    def history(sample_id: str) -> list[tuple[str, str, int]]:
        r = samples[sample_id]
        return list(zip(r["recent_items"], r["recent_types"], r["recent_ages_ms"], strict=True))
    assert history("imp") == [("i6", "click", 2000), ("i7", "click", 3000), ("i1", "click", 4500)]
    # the late impression looks its list up as of its own time: the click before it, not one after
    assert history("late_imp") == [("i7", "click", 500), ("i1", "click", 2000)]
    assert len(got.records) == len(samples) == 3
    assert health.late_dropped == 0


def test_a_users_list_is_forgotten_after_the_state_ttl_without_their_events(settings: Settings) -> None:
    """flink.state_ttl_s reaches the lists' state: u1's click is 8 s of event time before their
    impression (inside the 10 s lookback) but 18 s of processing time, past the 10 s TTL (Flink frees
    such state between 1 and 1.5 TTLs). u2, whose click came after the pause, keeps theirs."""
    s = job_settings(settings, horizons_s=None, attribution_window_s=5, history_length=3, history_lookback_s=10,
                     state_ttl_s=10)
    create_topics(s)
    with running_job(s):
        # 8500 - 2000 - 4500 (delay, hold-back): the samples' watermark passes u1's click, so its list
        # version is in state
        produce(s, [event("c1", "click", "u1", "i1", 1000), event("x", "impression", "u3", "i3", 8500)])
        # the job has read them once c1's window is out (the pause must be in the job's processing time)
        wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: any(
            r["entity_id"] == "u1" for r in got.records), isolation_level="read_uncommitted")
        time.sleep(18.0)
        produce(s, [event("c2", "click", "u2", "i2", 6500), event("imp1", "impression", "u1", "i9", 9000),
                    event("imp2", "impression", "u2", "i9", 9000),
                    event("flush", "impression", "u9", "i9", 120_000)])
        got = wait_for(s, s.kafka.topics.samples, "TrainingSample",
                       lambda got: {"imp1", "imp2"} <= {r["sample_id"] for r in got.records})
    samples = {r["sample_id"]: r for r in got.records}
    assert samples["imp2"]["recent_items"] == ["i2"] and samples["imp2"]["recent_ages_ms"] == [2500]
    assert samples["imp1"]["recent_items"] == []


def check_recent_lists(s: Settings, records: list[dict]) -> None:
    """The online store's copy of the lists: per user and 3 s window with engagements, the list as of the
    window's end (twice history_length kept, ties by item), through the loader into Redis."""
    lists = {(r["entity_id"], r["window_end"] - T): list(zip(r["recent_items"], r["recent_types"],
                                                              [t - T for t in r["recent_times_ms"]], strict=True))
             for r in records if r["horizon_s"] == 0}
    u3 = [("i5", "order", 11_000), ("i3", "cart", 10_000), ("i4", "click", 10_000), ("i2", "like", 9000),
          ("i1", "click", 8100)]
    assert lists == {
        ("u1", 3000): [("i1", "click", 200)],
        ("u1", 9000): [("i1", "like", 7000), ("i1", "click", 6000), ("i1", "click", 200)],
        ("u3", 9000): [("i1", "click", 8100)],
        ("u3", 12_000): u3,
        ("u3", 15_000): [("i6", "click", 13_000), *u3],
    }
    assert all(r["recent_items"] is None for r in records if r["horizon_s"] != 0)
    loaded = run_loader(LoaderConfig.from_settings(s, isolation_level="read_committed"),
                        RedisFeatureStore.from_settings(s.redis, s.flink), idle_exit_s=2.0)
    # freshness is kept per record with its horizon, so lists (0) and windows are told apart
    loaded_topic = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.features, "FeatureRecord").records
    assert sorted(loaded.horizons_s) == sorted(r["horizon_s"] for r in loaded_topic)
    assert len(loaded.latencies_ms) == loaded.records == len(loaded_topic) and 0 in loaded.horizons_s
    u1, u3_now, nobody = RedisFeatureStore.from_settings(s.redis, s.flink).get_recent_engagements(["u1", "u3", "u2"])
    assert nobody is None and u1 is not None and u3_now is not None
    assert u1.as_of_ms == T + 9000
    # served as the samples get them: at most 3, strictly before the request, within the 10 s lookback
    assert u3_now.before(T + 13_000, 3, 10_000) == (["i5", "i3", "i4"], ["order", "cart", "click"], [2000, 3000, 3000])
    assert u3_now.before(T + 22_000, 3, 10_000) == (["i6"], ["click"], [9000])
