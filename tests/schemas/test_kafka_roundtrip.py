"""Avro records through the real broker: what is produced is what is consumed."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from core.kafka import ensure_topics, producer_config
from core.settings import Settings
from schemas.kafka_io import AvroProducer, read_topic
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
