"""Kafka plumbing shared by producers, jobs and the trainer: topics, batched Avro produce/consume.

All network I/O is batched: producing relies on librdkafka's linger/batching (one `produce` call
per record only enqueues), consuming uses `consume(num_messages=...)`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from schemas.serde import Deserializer, Record, SerdeError, Serializer, deserializer, header_of, serializer


def ensure_topics(bootstrap: str, topics: Iterable[str], partitions: int = 2, timeout_s: float = 30.0) -> None:
    """Creates the topics that do not exist yet (replication factor 1: a single-node broker)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics if t not in existing]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"cannot create topic {topic}: {exc}") from exc


def producer_config(bootstrap: str, linger_ms: int = 20, batch_size_bytes: int = 1_000_000,
                    compression: str = "lz4", **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "linger.ms": linger_ms,
        "batch.size": batch_size_bytes,
        "compression.type": compression,
        "enable.idempotence": True,
        "queue.buffering.max.messages": 1_000_000,
        **extra,
    }


@dataclass
class DeliveryStats:
    delivered: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def callback(self, err: KafkaError | None, _msg: Any) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed += 1
            if len(self.errors) < 10:
                self.errors.append(str(err))


class AvroProducer:
    """Produces records of one schema to one topic, with the schema header on every record."""

    def __init__(self, config: Mapping[str, Any], topic: str, schema_name: str) -> None:
        self.topic = topic
        self.encode: Serializer = serializer(schema_name)
        self._producer = Producer(dict(config))
        self.stats = DeliveryStats()

    def produce(self, record: Mapping[str, Any], key: str | bytes | None = None,
                timestamp_ms: int | None = None) -> None:
        value = self.encode(record)
        while True:
            try:
                self._producer.produce(self.topic, value=value, key=key, headers=self.encode.headers,
                                       timestamp=timestamp_ms or 0, on_delivery=self.stats.callback)
                break
            except BufferError:  # local queue full: let librdkafka drain it, then retry
                self._producer.poll(0.05)
        self._producer.poll(0)

    def produce_many(self, records: Iterable[Mapping[str, Any]],
                     key: Callable[[Mapping[str, Any]], str | bytes | None] | None = None) -> int:
        n = 0
        for record in records:
            self.produce(record, key(record) if key else None)
            n += 1
        return n

    def flush(self, timeout_s: float = 60.0) -> DeliveryStats:
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise RuntimeError(f"{remaining} records to {self.topic} still undelivered after {timeout_s}s")
        if self.stats.failed:
            raise RuntimeError(f"{self.stats.failed} records to {self.topic} failed: {self.stats.errors}")
        return self.stats


@dataclass
class ConsumedBatch:
    records: list[Record]
    rejected: list[tuple[str, int, int, str]]  # (topic, partition, offset, reason)
    offsets: dict[tuple[str, int], int]  # next offset to read, per (topic, partition)


class AvroConsumer:
    """Consumes one schema in batches; undecodable records are returned as rejects, never raised."""

    def __init__(self, bootstrap: str, group_id: str, topics: list[str] | None, schema_name: str,
                 auto_offset_reset: str = "earliest", isolation_level: str = "read_committed",
                 **extra: Any) -> None:
        """Subscribes to `topics` as consumer group `group_id`; with `topics=None` the caller assigns."""
        self.decode: Deserializer = deserializer(schema_name)
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "auto.offset.reset": auto_offset_reset,
            "enable.auto.commit": False,
            "isolation.level": isolation_level,
            **extra,
        })
        if topics:
            self._consumer.subscribe(topics)

    @property
    def raw(self) -> Consumer:
        return self._consumer

    def poll_batch(self, max_records: int = 5000, timeout_s: float = 1.0) -> ConsumedBatch:
        messages = self._consumer.consume(num_messages=max_records, timeout=timeout_s)
        batch = ConsumedBatch([], [], {})
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            batch.offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
            try:
                batch.records.append(self.decode(msg.value(), header_of(msg.headers())))
            except SerdeError as exc:
                batch.rejected.append((msg.topic(), msg.partition(), msg.offset(), exc.reason))
        return batch

    def commit(self) -> None:
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise

    def close(self) -> None:
        self._consumer.close()


def consume_until(consumer: AvroConsumer, n: int, timeout_s: float = 30.0) -> ConsumedBatch:
    """Reads until `n` records (good + rejected) arrived or `timeout_s` passed."""
    total = ConsumedBatch([], [], {})
    deadline = time.monotonic() + timeout_s
    while len(total.records) + len(total.rejected) < n and time.monotonic() < deadline:
        got = consumer.poll_batch(timeout_s=0.5)
        total.records += got.records
        total.rejected += got.rejected
        total.offsets.update(got.offsets)
    return total


def read_topic(bootstrap: str, topic: str, schema_name: str, timeout_s: float = 60.0,
               isolation_level: str = "read_committed") -> ConsumedBatch:
    """Every record from the beginning up to the end offsets seen at call time (no consumer group)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer = AvroConsumer(bootstrap, "rtrec-reader", None, schema_name, isolation_level=isolation_level)
    raw = consumer.raw
    try:
        partitions = raw.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        ends = {p: raw.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in partitions}
        raw.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0])
        total = ConsumedBatch([], [], {})
        deadline = time.monotonic() + timeout_s
        # the position, not the last record's offset: transaction markers take offsets too
        reached = dict.fromkeys(ends, 0)
        while time.monotonic() < deadline and any(reached[p] < end for p, end in ends.items()):
            got = consumer.poll_batch(timeout_s=0.5)
            total.records += got.records
            total.rejected += got.rejected
            total.offsets.update(got.offsets)
            for tp in raw.position([TopicPartition(topic, p) for p in ends]):
                reached[tp.partition] = max(reached[tp.partition], tp.offset)
        return total
    finally:
        raw.close()
