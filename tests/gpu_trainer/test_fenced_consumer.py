"""The samples consumer's static membership fenced (librdkafka's one fatal consumer error), against the
real broker: the source joins again as a new consumer and goes on from the samples it polled last
(nothing skipped, nothing read twice), and ends with its cause when fencing goes on. The same for a
consumer its group left behind (core.group_watch)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from core.settings import Settings
from gpu_trainer.distributed import Ranks
from gpu_trainer.kafka_adapters import KafkaSampleSource
from schemas.kafka_io import AvroConsumer
from tests.gpu_trainer.samples import make_samples, produce_samples
from tests.gpu_trainer.test_service_kafka import trainer_settings

pytestmark = pytest.mark.integration


def source_of(s: Settings, instance_id: str) -> KafkaSampleSource:
    trainer = s.trainer.model_copy(update={"instance_id": instance_id})
    return KafkaSampleSource.from_settings(s.kafka, trainer)


def polled_ids(source: KafkaSampleSource, want: int, timeout_s: float = 60) -> list[str]:
    ids: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(ids) < want and time.monotonic() < deadline:
        batch = source.poll(want - len(ids), 0.5)
        if batch.columns is not None:
            ids += [str(i) for i in batch.columns.columns["sample_id"]]
    return ids


FENCED = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer with same "
                    "group.instance.id: OffsetCommit failed")  # as a consumed message's error, as the outage gave it


def test_a_fenced_consumer_joins_again_from_the_samples_polled_last(settings: Settings, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The fencing itself is the error librdkafka raises (the broker fenced the trainer this way after a 30 s
    outage, test_kafka_outage.py, once); the consumer that joins again is real."""
    s = trainer_settings(settings, tmp_path)
    before, after = make_samples(300), make_samples(200, seed=1, start=300)
    produce_samples(s, before + after)
    real, armed, fences = AvroConsumer.poll_columns, [False], [True]

    def fenced_once(consumer: AvroConsumer, *args: object, **kw: object) -> object:
        if armed[0] and fences:
            fences.pop()
            raise KafkaException(FENCED)
        return real(consumer, *args, **kw)

    monkeypatch.setattr(AvroConsumer, "poll_columns", fenced_once)
    source = source_of(s, f"trainer-{uuid.uuid4().hex[:6]}")
    source.start({})
    try:
        first = polled_ids(source, 300)
        armed[0] = True
        rest = polled_ids(source, 200)
    finally:
        source.close()
    assert not fences and len(source._fenced_at) == 1  # fenced once, joined again once
    # the fetches had read ahead past the 300 polled: the new consumer starts after them, not after those
    assert sorted(first + rest) == sorted(str(x["sample_id"]) for x in before + after)  # none lost, none twice


def test_fencing_that_goes_on_ends_with_the_cause(settings: Settings, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    s = trainer_settings(settings, tmp_path)
    produce_samples(s, make_samples(10))

    def fenced(*_args: object, **_kw: object) -> None:
        raise KafkaException(FENCED)

    monkeypatch.setattr(AvroConsumer, "poll_columns", fenced)
    source = source_of(s, "trainer-twin")
    source.start({})
    try:
        for _ in range(3):
            assert source.poll(10, 0.1).offsets == {}
        with pytest.raises(RuntimeError, match="another consumer in the group uses group.instance.id 'trainer-twin'"):
            source.poll(10, 0.1)
    finally:
        source.close()


def test_ranks_take_no_static_membership() -> None:
    """Ranks assign their partitions without the group protocol; under a static id their offset commits
    were fenced by the membership of the single process before a rescale (test_distributed.py, agents)."""
    alone = KafkaSampleSource("127.0.0.1:9", "samples", "group", "trainer-0")
    ranked = KafkaSampleSource("127.0.0.1:9", "samples", "group", "trainer-0", ranks=Ranks(1, 2))
    try:
        assert (alone.instance_id, ranked.instance_id) == ("trainer-0", None)
    finally:
        alone.close()
        ranked.close()


def test_a_consumer_its_group_left_behind_is_replaced_from_the_samples_polled_last(
        settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's lost coordinator cannot be brought about on demand, so the watch's verdict is forced
    once; the consumer that replaces the left-behind one is real."""
    from core.group_watch import GroupWatch

    s = trainer_settings(settings, tmp_path)
    before, after = make_samples(300), make_samples(200, seed=1, start=300)
    produce_samples(s, before + after)
    verdicts = [True]

    def forced_once(watch: GroupWatch, consumer: object, polled_records: bool = False) -> bool:
        return bool(armed and verdicts and verdicts.pop())

    armed: list[bool] = []
    monkeypatch.setattr(GroupWatch, "left_behind", forced_once)
    source = source_of(s, f"trainer-{uuid.uuid4().hex[:6]}")
    source.start({})
    try:
        first = polled_ids(source, 300)
        armed.append(True)
        rest = polled_ids(source, 100)  # the old consumer's last poll; the new one reads the other 100
        rest += polled_ids(source, 100)
        more = polled_ids(source, 1, timeout_s=5)
    finally:
        source.close()
    assert not verdicts and not more  # replaced once; the new consumer read nothing polled before
    assert sorted(first + rest) == sorted(str(x["sample_id"]) for x in before + after)  # none lost, none twice
