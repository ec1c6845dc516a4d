"""The Avro contracts over Kafka: a producer and a consumer of one schema each, headers included.

Transport (configurations, topics, the poll loop) is `core.kafka`; this module only encodes,
decodes and turns undecodable records into `Reject`s, never exceptions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from core.collector import cyclic_gc_paused
from core.kafka import consumer_config, poll_messages
from schemas.bulk import BulkDecoded, BulkDecoder, take_ragged
from schemas.dead_letter import Reject
from schemas.sample_blocks import BLOCK_SCHEMA, block_columns, samples_in, unpack
from schemas.serde import (
    Deserializer,
    Record,
    SerdeError,
    Serializer,
    deserializer,
    header_of,
    header_values,
    serializer,
)
from schemas.utf8_column import concat_columns


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
    rejected: list[Reject]  # undecodable records, with where they came from
    offsets: dict[tuple[str, int], int]  # next offset to read, per (topic, partition)
    columns: BulkDecoded | None = None  # instead of `records`, from `AvroConsumer.poll_columns`

    def extend(self, other: ConsumedBatch) -> None:
        if self.columns is not None or other.columns is not None:
            raise ValueError("batches decoded in bulk are not extended")
        self.records += other.records
        self.rejected += other.rejected
        self.offsets.update(other.offsets)


class AvroConsumer:
    """Consumes one schema in batches; undecodable records are returned as rejects, never raised."""

    def __init__(self, bootstrap: str, group_id: str, topics: list[str] | None, schema_name: str,
                 auto_offset_reset: str = "earliest", isolation_level: str = "read_committed",
                 keep_rejected_values: bool = False, **extra: Any) -> None:
        """Subscribes to `topics` as consumer group `group_id`; with `topics=None` the caller assigns.
        A TrainingSample consumer also takes TrainingSampleBlocks, as the samples each holds."""
        self.decode: Deserializer = deserializer(schema_name)
        self._blocks = deserializer(BLOCK_SCHEMA) if schema_name == "TrainingSample" else None
        self._most_per_message = 1  # samples in the largest message polled (blocks): how many a poll asks for
        self.keep_rejected_values = keep_rejected_values
        self._consumer = Consumer(consumer_config(bootstrap, group_id, isolation_level, auto_offset_reset, **extra))
        if topics:
            self._consumer.subscribe(topics)

    @property
    def raw(self) -> Consumer:
        return self._consumer

    def poll_batch(self, max_records: int = 5000, timeout_s: float = 1.0, fill: bool = False) -> ConsumedBatch:
        """What has arrived, or with `fill` up to `max_records` or `timeout_s` (core.kafka.poll_messages)."""
        batch = ConsumedBatch([], [], {})
        # one pause from taking the messages to dropping them (core.collector)
        with cyclic_gc_paused() as pause:
            messages = poll_messages(self._consumer, max_records, timeout_s, fill=fill, pause=pause)
            for msg in messages:
                batch.offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
                header = header_of(msg.headers())
                try:
                    if self._is_block(header):
                        batch.records += unpack(self._blocks(msg.value(), header))  # type: ignore[misc]
                    else:
                        batch.records.append(self.decode(msg.value(), header))
                except SerdeError as exc:
                    batch.rejected.append(Reject(exc.reason, msg.topic(), msg.partition(), msg.offset(),
                                                 value=msg.value() if self.keep_rejected_values else None))
            del messages  # freed by reference counting while paused, so they set off no collection
        return batch

    def _is_block(self, header: bytes | None) -> bool:
        return self._blocks is not None and header is not None and header.startswith(_BLOCK_HEADER_PREFIX)

    def poll_columns(self, decoder: BulkDecoder, widths: Mapping[str, int], max_records: int = 5000,
                     timeout_s: float = 1.0, fill: bool = False, as_bytes: Collection[str] = ()) -> ConsumedBatch:
        """As `poll_batch`, decoded in bulk (schemas.bulk): the records come back as columns.
        `max_records` counts samples where messages are blocks of them: the poll stops at the first
        block that reaches it (a block is trained, and its offset passed, whole). It takes one message
        first, then as many as the largest message seen says are still wanted: a batch goes past
        `max_records` by less than one block unless the blocks grow beyond any seen before. `as_bytes`:
        ids to return as a Utf8Column each (see schemas.sample_blocks.block_columns), whenever blocks
        are among what was polled."""
        with cyclic_gc_paused() as pause:
            deadline = time.monotonic() + timeout_s
            messages: list[Message] = []
            values: list[bytes | None] = []
            headers: list[bytes | None] = []
            got = 0
            while got < max_records:
                want = (1 if self._blocks is not None and not messages else
                        max(1, math.ceil((max_records - got) / self._most_per_message)))
                more = poll_messages(self._consumer, want, max(deadline - time.monotonic(), 0.0), fill=fill,
                                     pause=pause)
                if not more:
                    break
                messages += more
                new_values = list(map(Message.value, more))
                new_headers = header_values(list(map(Message.headers, more)), decoder.header_value)
                values += new_values
                headers += new_headers
                if self._blocks is None:
                    got += len(more)
                else:
                    counts = [samples_in(v) if self._is_block(h) else 1
                              for v, h in zip(new_values, new_headers, strict=True)]
                    got += sum(counts)
                    self._most_per_message = max(self._most_per_message, *counts)
                # without `fill` one round, but for a block-aware consumer's first, which took one message
                if not fill and not (self._blocks is not None and len(messages) == 1 and got < max_records):
                    break
            # the last message of each partition gives its next offset: one dict entry per partition
            last = {(msg.topic(), msg.partition()): msg for msg in messages}
            batch = ConsumedBatch([], [], {key: msg.offset() + 1 for key, msg in last.items()})
            batch.columns = self._decode_columns(decoder, values, headers, widths, messages, batch.rejected,
                                                 as_bytes)
            del messages, last  # freed by reference counting while paused, so they set off no collection
        return batch

    def _decode_columns(self, decoder: BulkDecoder, values: list[bytes | None], headers: list[bytes | None],
                        widths: Mapping[str, int], messages: list[Message], rejected: list[Reject],
                        as_bytes: Collection[str] = ()) -> BulkDecoded:
        """Plain records in bulk, blocks one by one (each its columns), the samples back in message order."""
        blocks = [i for i, h in enumerate(headers) if self._is_block(h)] if self._blocks is not None else []
        if not blocks:
            decoded = decoder.decode(values, headers, widths)
            bad = list(decoded.rejected)
        else:
            plain = np.setdiff1d(np.arange(len(values)), blocks, assume_unique=True)
            parts: list[BulkDecoded] = []
            origin: list[np.ndarray] = []  # each part's samples' message indices
            bad = []
            if len(plain):
                part = decoder.decode([values[i] for i in plain], [headers[i] for i in plain], widths)
                parts.append(part)
                origin.append(plain[part.rows])
                bad += [(int(plain[i]), reason) for i, reason in part.rejected]
            for i in blocks:
                try:
                    block = self._blocks(values[i], headers[i])  # type: ignore[misc]
                    part = _block_decoded(decoder, block_columns(block, widths.get("features"), decoder.keep, as_bytes))
                except SerdeError as exc:
                    bad.append((i, exc.reason))
                    continue
                parts.append(part)
                origin.append(np.full(len(part), i, dtype=np.int64))
            if not parts:  # every block refused: the columns of no samples
                parts, origin = [decoder.decode([], [], widths)], [np.zeros(0, dtype=np.int64)]
            decoded = _concat_decoded(parts, np.argsort(np.concatenate(origin), kind="stable"), sorted(bad))
        for i, reason in sorted(bad):
            msg = messages[i]
            rejected.append(Reject(reason, msg.topic(), msg.partition(), msg.offset(),
                                   value=values[i] if self.keep_rejected_values else None))
        return decoded

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commits `offsets` (next to read, per partition), or the consumer's positions."""
        try:
            if offsets is None:
                self._consumer.commit(asynchronous=False)
            elif offsets:
                self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                      asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise

    def close(self) -> None:
        self._consumer.close()


_BLOCK_HEADER_PREFIX = f"{BLOCK_SCHEMA}:".encode()  # any version of the block schema


def _block_decoded(decoder: BulkDecoder, columns: dict[str, np.ndarray]) -> BulkDecoded:
    """A block's columns as `decoder` returns a TrainingSample's: its kept fields, the lists' counts."""
    counts = {"features": columns["feature_len"], **dict.fromkeys(("recent_items", "recent_types", "recent_ages_ms"),
                                                                  columns["recent_count"])}
    return BulkDecoded({k: v for k, v in columns.items() if k in decoder.keep},
                       {k: v for k, v in counts.items() if k in decoder.keep},
                       np.arange(len(columns["label"]), dtype=np.int64), [])


def _concat_decoded(parts: list[BulkDecoded], order: np.ndarray, rejected: list[tuple[int, str]]) -> BulkDecoded:
    """The rows of `parts` end to end, then in `order`; `rows` counts them (their messages' indices
    are no longer one to one)."""
    columns, lengths = {}, {}
    rows = np.arange(len(order), dtype=np.int64)
    in_order = bool((order == rows).all())  # blocks alone, or every plain record before the blocks
    for k in parts[0].lengths:
        lengths[k] = np.concatenate([p.lengths[k] for p in parts])
    for k, first in parts[0].columns.items():
        both = concat_columns([p.columns[k] for p in parts])
        if in_order:
            columns[k] = both
        elif k in lengths and first.ndim == 1:  # a ragged column's items
            columns[k] = take_ragged(both, lengths[k], order)
        else:
            columns[k] = both[order]
    return BulkDecoded(columns, lengths if in_order else {k: v[order] for k, v in lengths.items()}, rows, rejected)


def consume_until(consumer: AvroConsumer, n: int, timeout_s: float = 30.0) -> ConsumedBatch:
    """Reads until `n` records (good + rejected) arrived or `timeout_s` passed."""
    total = ConsumedBatch([], [], {})
    deadline = time.monotonic() + timeout_s
    while len(total.records) + len(total.rejected) < n and time.monotonic() < deadline:
        total.extend(consumer.poll_batch(timeout_s=0.5))
    return total


# _UNKNOWN_PARTITION: the broker listed the partition, but this client's own metadata of the topic did
# not have it yet (seen with a topic the job had just created, on a loaded machine)
_NOT_READY = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT, KafkaError._UNKNOWN_PARTITION}


def _end_offset(consumer: Consumer, tp: TopicPartition, deadline: float) -> int:
    """The partition's end offset; a partition just created has no leader for a moment, so those
    errors are retried until `deadline`."""
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(deadline - time.monotonic(), 1.0))[1]
        except KafkaException as exc:
            if exc.args[0].code() not in _NOT_READY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def read_topic(bootstrap: str, topic: str, schema_name: str, timeout_s: float = 60.0,
               isolation_level: str = "read_committed", since_ms: int | None = None,
               security: Mapping[str, str] | None = None) -> ConsumedBatch:
    """Every record from the beginning (or from the first with a timestamp at or after `since_ms`) up
    to the end offsets seen at call time (no consumer group)."""
    consumer = AvroConsumer(bootstrap, "rtrec-reader", None, schema_name, isolation_level=isolation_level,
                            **(security or {}))
    raw = consumer.raw
    try:
        deadline = time.monotonic() + timeout_s
        partitions = raw.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        ends = {p: _end_offset(raw, TopicPartition(topic, p), deadline) for p in partitions}
        starts = dict.fromkeys(ends, OFFSET_BEGINNING)
        if since_ms is not None and ends:
            found = raw.offsets_for_times([TopicPartition(topic, p, since_ms) for p in ends], timeout=timeout_s)
            starts = {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}
        # the position, not the last record's offset: transaction markers take offsets too
        reached = {p: max(starts[p], 0) for p in ends}
        raw.assign([TopicPartition(topic, p, starts[p]) for p, end in ends.items() if reached[p] < end])
        total = ConsumedBatch([], [], {})
        while time.monotonic() < deadline and any(reached[p] < end for p, end in ends.items()):
            total.extend(consumer.poll_batch(timeout_s=0.5))
            for tp in raw.position([TopicPartition(topic, p) for p in ends]):
                reached[tp.partition] = max(reached[tp.partition], tp.offset)
        return total
    finally:
        raw.close()
