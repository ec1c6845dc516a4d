"""The feature job on the real broker, embedded Flink mini-cluster."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from core.settings import Settings
from tests.flink_jobs.harness import T, create_topics, event, job_settings, produce, running_job, wait_for

pytestmark = pytest.mark.integration


def by_key(records: list[dict]) -> dict[tuple, dict]:
    return {(r["entity_type"], r["entity_id"], r["horizon_s"], r["window_start"] - T): r for r in records}


def java_id_hash(entity_id: str) -> int:
    """The job's CounterpartHash.hash, written again here: FNV-1a over UTF-16 units, MurmurHash3's finaliser."""
    mask = (1 << 64) - 1
    h = 0xCBF29CE484222325
    units = entity_id.encode("utf-16-le")
    for k in range(0, len(units), 2):
        h = ((h ^ int.from_bytes(units[k:k + 2], "little")) * 0x100000001B3) & mask
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        h = ((h ^ (h >> 33)) * multiplier) & mask
    return (h ^ (h >> 33)) >> 1


def test_exact_windows_out_of_order_late_and_malformed(settings: Settings) -> None:
    s = job_settings(settings, distinct_sketch_size=1)  # a tile of two counterparts keeps the smaller hash
    create_topics(s)
    phase1 = [
        event("e1", "impression", "u1", "i1", 100), event("e2", "impression", "u1", "i2", 500),
        event("e3", "click", "u1", "i1", 900, dwell=1000), event("e4", "impression", "u2", "i1", 2900),
        event("e5", "impression", "u2", "i2", 1000),  # out of order, within the 2 s bound
        event("e6", "impression", "u1", "i1", 3500), event("e7", "click", "u1", "i1", 4000, dwell=3000),
        event("e8", "impression", "u3", "i3", 9000),  # watermark -> T+7000: windows up to T+6000 close
    ]
    with running_job(s, with_samples=False):
        produce(s, phase1)
        raw = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
        raw.produce(s.kafka.topics.events, value=b"\x00\x01garbage",
                    headers=[("rtrec-schema", b"InteractionEvent:0000000000000000")])
        raw.flush(10)
        first = wait_for(s, s.kafka.topics.features, "FeatureRecord",
                         lambda got: any(r["window_start"] == T + 3000 for r in got.records))
        assert first.records, "no feature records after phase 1"
        produce(s, [event("e9", "impression", "u1", "i1", 2000),  # late: its window closed at T+3000
                    event("e10", "impression", "u9", "i9", 60_000)])  # flushes every window before T+58000
        got = wait_for(s, s.kafka.topics.features, "FeatureRecord",
                       lambda got: any(r["entity_id"] == "u3" and r["horizon_s"] == 3 for r in got.records))
        dead = wait_for(s, s.kafka.topics.dead_letter, "DeadLetter", lambda got: len(got.records) >= 2)

    features = by_key(got.records)
    u1 = features[("user", "u1", 3, 0)]
    assert (u1["impressions"], u1["clicks"], u1["ctr"], u1["dwell_sum_ms"], u1["dwell_mean_ms"],
            u1["distinct_counterparts"]) == (2, 1, 0.5, 1000, 1000.0, 2)
    assert u1["window_end"] - T == 3000
    u2 = features[("user", "u2", 3, 0)]
    assert (u2["impressions"], u2["clicks"], u2["distinct_counterparts"]) == (2, 0, 2)  # e5 counted
    i1 = features[("item", "i1", 3, 0)]
    assert (i1["impressions"], i1["clicks"], i1["ctr"], i1["distinct_counterparts"]) == (2, 1, 0.5, 2)
    pair = features[("user_item", "u1|i1", 3, 0)]
    assert (pair["ctr"], pair["distinct_counterparts"]) == (1.0, 1)
    second = features[("user", "u1", 3, 3000)]
    assert (second["impressions"], second["clicks"], second["dwell_sum_ms"]) == (1, 1, 3000)
    assert (u1["dwell_count"], second["dwell_count"]) == (1, 1)
    # the 6 s horizon hops by 3 s, so its tiles are the 3 s windows (the store adds them up when read): a
    # user's or item's window is one record, which lists the horizon it is a tile of; a pair's is not one
    assert not any(r["horizon_s"] == 6 for r in got.records)
    assert {(r["entity_type"], tuple(r["tile_of_horizons_s"] or ())) for r in got.records if r["horizon_s"] == 3} == {
        ("user", (6,)), ("item", (6,)), ("user_item", ())}
    tile0, tile1 = u1, second
    assert (tile0["impressions"], tile0["clicks"], tile1["impressions"], tile1["clicks"]) == (2, 1, 1, 1)
    # a tile's sketch: the smallest hashes of its counterparts, one kept here; none outside the tiles
    assert tile0["counterpart_hashes"] == [min(java_id_hash("i1"), java_id_hash("i2"))]
    assert tile1["counterpart_hashes"] == [java_id_hash("i1")]
    assert features[("item", "i1", 3, 0)]["counterpart_hashes"] == [min(java_id_hash("u1"), java_id_hash("u2"))]
    assert all(r["counterpart_hashes"] is None for r in got.records if r["entity_type"] == "user_item")
    # the late e9 changed nothing and is in the dead-letter topic with its reason, next to the malformed one
    assert len([r for r in got.records if (r["entity_id"], r["horizon_s"], r["window_start"]) == ("u1", 3, T)]) == 1
    reasons = sorted(d["reason"] for d in dead.records)
    assert any(r.startswith("late: event_time 1700000000000") for r in reasons), reasons
    assert any(r.startswith("unknown schema InteractionEvent:0000000000000000") for r in reasons), reasons
    assert all(d["stage"] == "feature-job" and d["source_topic"] == s.kafka.topics.events for d in dead.records)


def test_the_job_creates_the_topics_it_reads_and_writes(settings: Settings) -> None:
    """On a broker where nothing has created them yet (the job used to restart on UnknownTopicOrPartition
    until it gave up)."""
    s = job_settings(settings)
    k = s.kafka
    wanted = {k.topics.events, k.topics.features, k.topics.samples, k.topics.dead_letter}
    admin = AdminClient({"bootstrap.servers": k.bootstrap_servers})
    assert not wanted & set(admin.list_topics(timeout=10).topics)
    with running_job(s):
        assert wanted <= set(admin.list_topics(timeout=10).topics)
        produce(s, [event("e1", "impression", "u1", "i1", 100), event("e2", "impression", "u2", "i2", 9000)])
        got = wait_for(s, k.topics.features, "FeatureRecord",
                       lambda got: any(r["entity_id"] == "u1" and r["horizon_s"] == 3 for r in got.records))
    u1 = by_key(got.records)[("user", "u1", 3, 0)]
    assert (u1["impressions"], u1["clicks"]) == (1, 0)


def test_distinct_counterparts_and_sketches_of_crowded_tiles(settings: Settings) -> None:
    """A tile with more counterparts than its sketch keeps, each seen more than once: the distinct count
    is exact, the sketch the smallest hashes of them all, in the base window's record (a tile of the
    60 s horizon) and in the 30 s tile of the 600 s horizon."""
    s = job_settings(settings, horizons_s=None)
    create_topics(s)
    items = [f"item-{n}" for n in range(150)]
    users = [f"user-{n}" for n in range(100)]
    events = [event(f"a{n}", "impression", "u1", item, 100 + n) for n, item in enumerate(items)]
    events += [event(f"b{n}", "click", "u1", item, 400 + n) for n, item in enumerate(items[:50])]  # repeats
    events += [event(f"c{n}", "impression", user, "i0", 700 + n) for n, user in enumerate(users)]
    with running_job(s, with_samples=False):
        produce(s, [*events, event("flush", "impression", "u9", "i9", 60_000)])
        got = wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: {
            ("u1", 3), ("u1", 600), ("i0", 3), ("i0", 600)} <= {(r["entity_id"], r["horizon_s"]) for r in got.records})
    records = {(r["entity_id"], r["horizon_s"]): r for r in got.records}
    for entity, counterparts in (("u1", items), ("i0", users)):
        smallest = sorted({java_id_hash(c) for c in counterparts})[:64]
        for horizon in (3, 600):
            r = records[(entity, horizon)]
            assert r["distinct_counterparts"] == len(counterparts), (entity, horizon)
            assert r["counterpart_hashes"] == smallest, (entity, horizon)
