"""Avro records through the real broker: what is produced is what is consumed."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from core.kafka import ensure_topics, producer_config
from core.settings import Settings
from schemas.kafka_io import AvroConsumer, AvroProducer, read_topic
from tests.schemas.test_serde import EXAMPLES

pytestmark = pytest.mark.integration


def test_avro_round_trip_through_kafka(settings: Settings) -> None:
    topic = settings.kafka.topics.events
    ensure_topics(settings.kafka.bootstrap_servers, [topic], partitions=2)
    producer = AvroProducer(producer_config(settings.kafka.bootstrap_servers), topic, "InteractionEvent")
    sent = [dict(EXAMPLES["InteractionEvent"], event_id=f"e{i}", user_id=f"u{i % 7}") for i in range(500)]
    producer.produce_many(sent, key=lambda r: r["user_id"])
    assert producer.flush().delivered == 500

    got = read_topic(settings.kafka.bootstrap_servers, topic, "InteractionEvent", timeout_s=30)
    assert got.rejected == []
    assert sorted(got.records, key=lambda r: int(r["event_id"][1:])) == sent
    assert sum(got.offsets.values()) == 500


def test_foreign_records_are_rejected_with_reason_not_raised(settings: Settings) -> None:
    topic = settings.kafka.topics.events
    ensure_topics(settings.kafka.bootstrap_servers, [topic], partitions=1)
    raw = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    raw.produce(topic, value=b"not avro at all")
    raw.produce(topic, value=b"\x02", headers=[("rtrec-schema", b"InteractionEvent:deadbeefdeadbeef")])
    raw.flush(10)
    good = AvroProducer(producer_config(settings.kafka.bootstrap_servers), topic, "InteractionEvent")
    good.produce(EXAMPLES["InteractionEvent"])
    good.flush()

    got = read_topic(settings.kafka.bootstrap_servers, topic, "InteractionEvent", timeout_s=30)
    assert got.records == [EXAMPLES["InteractionEvent"]]
    reasons = [r.reason for r in got.rejected]
    assert reasons == ["missing rtrec-schema header", "unknown InteractionEvent schema fingerprint deadbeefdeadbeef"]


def test_a_consumer_waits_for_a_topic_that_does_not_exist_yet(settings: Settings,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The trainer may start before the job creates the samples topic: it waits, it does not crash."""
    topic = f"{settings.kafka.topics.samples}.later"
    consumer = AvroConsumer(settings.kafka.bootstrap_servers, f"g-{topic}", [topic], "InteractionEvent",
                            auto_offset_reset="earliest")
    try:
        with caplog.at_level("WARNING", logger="rtrec.kafka"):
            assert consumer.poll_batch(10, 3.0).records == []
        assert any(topic in r.getMessage() and "waiting for the topic" in r.getMessage() for r in caplog.records)
        ensure_topics(settings.kafka.bootstrap_servers, [topic], partitions=1)
        producer = AvroProducer(producer_config(settings.kafka.bootstrap_servers), topic, "InteractionEvent")
        producer.produce(EXAMPLES["InteractionEvent"])
        assert producer.flush().delivered == 1
        got: list = []
        for _ in range(30):
            got += consumer.poll_batch(10, 1.0).records
            if got:
                break
        assert got == [EXAMPLES["InteractionEvent"]]
    finally:
        consumer.close()
