"""The trainer's Kafka adapters against the real broker: where the source starts, seeks and what it
commits; what the outputs write."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from core.settings import Settings
from gpu_trainer.kafka_adapters import KafkaSampleSource, KafkaTrainerOutputs
from schemas.dead_letter import Reject
from schemas.kafka_io import read_topic
from schemas.sample_blocks import BLOCK_SCHEMA, pack
from schemas.serde import serializer
from tests.gpu_trainer.samples import make_samples, produce_samples

pytestmark = pytest.mark.integration


@dataclass
class Drained:
    sample_ids: list[str] = field(default_factory=list)
    rejected: list[Reject] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def drain(source: KafkaSampleSource, n: int, timeout_s: float = 30.0) -> Drained:
    """The source's polls (decoded in bulk, as columns) until `n` samples came."""
    total = Drained()
    deadline = time.monotonic() + timeout_s
    while len(total.sample_ids) < n and time.monotonic() < deadline:
        batch = source.poll(500, 0.5)
        assert batch.columns is not None
        total.sample_ids += batch.columns.columns["sample_id"].tolist()
        total.rejected += batch.rejected
        total.offsets.update(batch.offsets)
    return total


def test_source_starts_at_the_given_offsets_seeks_and_commits(settings: Settings) -> None:
    k, t = settings.kafka, settings.trainer.model_copy(update={"group_id": f"g-{settings.redis.key_prefix}",
                                                               "instance_id": f"i-{settings.redis.key_prefix}"})
    samples = make_samples(400)
    produce_samples(settings, samples)
    counts = {p: n for (_, p), n in read_topic(k.bootstrap_servers, k.topics.samples, "TrainingSample").offsets.items()}
    assert sum(counts.values()) == 400

    source = KafkaSampleSource.from_settings(k, t)
    start = {(k.topics.samples, 0): 10}  # partition 1 absent: from its beginning
    source.start(start)
    try:
        got = drain(source, 400 - 10)
        assert len(got.sample_ids) == 400 - 10 and got.rejected == []
        assert got.offsets == {(k.topics.samples, p): n for p, n in counts.items()}
        assert source.has_partitions() and source.lag() == 0

        source.seek({(k.topics.samples, 0): counts[0] - 5, (k.topics.samples, 1): counts[1]})
        again = drain(source, 5)
        assert len(again.sample_ids) == 5

        source.commit({(k.topics.samples, 0): 3})
        group = Consumer({"bootstrap.servers": k.bootstrap_servers, "group.id": t.group_id})
        committed = group.committed([TopicPartition(k.topics.samples, 0)], timeout=10)
        group.close()
        assert committed[0].offset == 3
    finally:
        source.close()


def test_outputs_create_their_topics_and_write_dead_letters_and_announcements(settings: Settings) -> None:
    k = settings.kafka
    outputs = KafkaTrainerOutputs.from_settings(k).open()
    outputs.dead_letter([Reject("sample s1: bad", k.topics.samples, 1, 7, value=b"\x01")])
    outputs.announce({"version": 3, "parent": 2, "created_at": 1, "uri": "/x", "manifest_sha256": "ab",
                      "model_name": "mf", "samples_seen": 9, "offsets": [], "auc": None, "logloss": None,
                      "promoted": False})
    dead = read_topic(k.bootstrap_servers, k.topics.dead_letter, "DeadLetter").records
    assert [(d["stage"], d["reason"], d["source_partition"], d["source_offset"], d["value"]) for d in dead] == \
        [("trainer", "sample s1: bad", 1, 7, b"\x01")]
    announced = read_topic(k.bootstrap_servers, k.topics.snapshots, "ModelSnapshot").records
    assert [a["version"] for a in announced] == [3]


def test_blocks_and_single_samples_come_in_message_order_and_a_broken_block_is_rejected_whole(
        settings: Settings) -> None:
    k = settings.kafka.model_copy(update={"partitions": 1})  # one partition: one order to compare with
    s = settings.model_copy(update={"kafka": k})
    samples = make_samples(1000, seed=5)
    produce_samples(s, samples[:300], per_message=100)
    produce_samples(s, samples[300:450])
    broken = dict(pack(samples[450:460]), labels=b"\x01")
    raw = Producer({"bootstrap.servers": k.bootstrap_servers})
    raw.produce(k.topics.samples, value=serializer(BLOCK_SCHEMA)(broken), headers=serializer(BLOCK_SCHEMA).headers)
    raw.flush(10)
    produce_samples(s, samples[460:], per_message=265)  # the last block holds 10
    expected = [x["sample_id"] for x in samples[:450] + samples[460:]]

    records = read_topic(k.bootstrap_servers, k.topics.samples, "TrainingSample")
    assert [r["sample_id"] for r in records.records] == expected
    assert [(r.reason, r.offset) for r in records.rejected] == \
        [("TrainingSampleBlock: labels holds 1 bytes, 10 items take 10", 3 + 150)]

    t = settings.trainer.model_copy(update={"group_id": f"g-{settings.redis.key_prefix}", "instance_id": None})
    source = KafkaSampleSource.from_settings(k, t)
    source.start({})
    try:
        got = drain(source, len(expected))
        assert got.sample_ids == expected
        assert [(r.offset, r.value is not None) for r in got.rejected] == [(153, True)]
        assert got.offsets == {(k.topics.samples, 0): 3 + 150 + 1 + 3}
    finally:
        source.close()


def test_a_poll_of_blocks_stops_at_the_first_block_that_reaches_the_batch(settings: Settings) -> None:
    k = settings.kafka.model_copy(update={"partitions": 1})
    produce_samples(settings.model_copy(update={"kafka": k}), make_samples(2000), per_message=150)
    t = settings.trainer.model_copy(update={"group_id": f"g-{settings.redis.key_prefix}", "instance_id": None})
    source = KafkaSampleSource.from_settings(k, t)
    source.start({})
    try:
        sizes = []
        deadline = time.monotonic() + 30
        while sum(sizes) < 2000 and time.monotonic() < deadline:
            batch = source.poll(500, 0.5)
            assert batch.columns is not None
            sizes.append(len(batch.columns))
        assert sizes == [600, 600, 600, 200]  # 4 blocks of 150 reach 500; 2000 = 13 blocks and 50
    finally:
        source.close()


def test_a_poll_of_refused_blocks_alone_gives_no_samples_and_their_dead_letters(settings: Settings) -> None:
    k = settings.kafka.model_copy(update={"partitions": 1})
    produce_samples(settings.model_copy(update={"kafka": k}), [])  # creates the topic
    block = serializer(BLOCK_SCHEMA)
    raw = Producer({"bootstrap.servers": k.bootstrap_servers})
    for cut in (1, 2):
        raw.produce(k.topics.samples, value=block(dict(pack(make_samples(3)), labels=b"\x00" * cut)),
                    headers=block.headers)
    raw.flush(10)
    t = settings.trainer.model_copy(update={"group_id": f"g-{settings.redis.key_prefix}", "instance_id": None})
    source = KafkaSampleSource.from_settings(k, t)
    source.start({})
    try:
        deadline = time.monotonic() + 30
        rejected: list[Reject] = []
        while len(rejected) < 2 and time.monotonic() < deadline:
            batch = source.poll(500, 0.5)
            assert batch.columns is not None and len(batch.columns) == 0
            assert batch.columns.columns["features"].shape == (0, 20)
            rejected += batch.rejected
        assert [(r.offset, r.reason) for r in rejected] == [
            (0, "TrainingSampleBlock: labels holds 1 bytes, 3 items take 3"),
            (1, "TrainingSampleBlock: labels holds 2 bytes, 3 items take 3")]
    finally:
        source.close()
