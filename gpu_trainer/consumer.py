"""The trainer's Kafka I/O: the samples consumer (positioned from the snapshot's offsets), the
dead-letter producer and the snapshots-topic producer."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from feature_store.feature_set import FEATURE_NAMES, FEATURE_SET
from gpu_trainer.batch import Columns
from schemas.kafka_io import AvroProducer, ensure_topics, producer_config
from schemas.serde import SerdeError, deserializer, header_of

log = logging.getLogger("rtrec.trainer")


@dataclass
class MicroBatch:
    columns: Columns
    rejected: list[tuple[str, int, int, str, bytes | None]]  # topic, partition, offset, reason, value
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # next offset per partition


class SampleSource:
    """Consumes TrainingSamples as group `group_id`; every assigned partition starts at the offset
    in `start_offsets` (the loaded snapshot's), or at the beginning when the snapshot has none, so a
    restart neither skips nor repeats a sample whatever the group's committed offsets say."""

    def __init__(self, bootstrap: str, topic: str, group_id: str, start_offsets: Mapping[tuple[str, int], int],
                 n_features: int = len(FEATURE_NAMES), feature_set: str = FEATURE_SET,
                 instance_id: str | None = None, session_timeout_ms: int = 10_000) -> None:
        self.topic = topic
        self.start_offsets = dict(start_offsets)
        self.n_features = n_features
        self.feature_set = feature_set
        self.decode = deserializer("TrainingSample")
        self.assigned: set[int] = set()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                                   "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                   "isolation.level": "read_committed", "fetch.min.bytes": 1,
                                   "session.timeout.ms": session_timeout_ms,
                                   **({"group.instance.id": instance_id} if instance_id else {})})
        self._consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            tp.offset = self.start_offsets.get((tp.topic, tp.partition), OFFSET_BEGINNING)
            self.assigned.add(tp.partition)
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.assigned.discard(tp.partition)

    def poll(self, max_samples: int, timeout_ms: int) -> MicroBatch:
        """Closes a micro-batch at `max_samples` or after `timeout_ms`, whichever comes first."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        records: list[dict[str, Any]] = []
        rejected: list[tuple[str, int, int, str, bytes | None]] = []
        offsets: dict[tuple[str, int], int] = {}
        while len(records) + len(rejected) < max_samples:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            messages = self._consumer.consume(num_messages=max_samples - len(records) - len(rejected),
                                              timeout=remaining)
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
                try:
                    records.append(self.decode(msg.value(), header_of(msg.headers())))
                except SerdeError as exc:
                    rejected.append((msg.topic(), msg.partition(), msg.offset(), exc.reason, msg.value()))
        columns = Columns.from_records(records)
        good = self._validate(columns, rejected)
        return MicroBatch(columns.select(good), rejected, offsets)

    def _validate(self, columns: Columns, rejected: list[tuple[str, int, int, str, bytes | None]]) -> np.ndarray:
        """Mask of usable samples; the others join `rejected` with their reason."""
        wrong_len = columns.feature_len != self.n_features
        wrong_set = columns.feature_set != self.feature_set
        non_finite = ~np.isfinite(columns.features).all(axis=1) if len(columns) else np.zeros(0, dtype=bool)
        bad_label = ~np.isin(columns.label, (0.0, 1.0))
        bad = wrong_len | wrong_set | non_finite | bad_label
        for i in np.flatnonzero(bad):
            if wrong_len[i]:
                reason = f"expected {self.n_features} features, got {columns.feature_len[i]}"
            elif wrong_set[i]:
                reason = f"feature set {columns.feature_set[i]!r}, trainer expects {self.feature_set!r}"
            elif non_finite[i]:
                reason = "non-finite feature value (NaN or inf)"
            else:
                reason = f"label {columns.label[i]} is not 0 or 1"
            rejected.append((self.topic, -1, -1, f"sample {columns.sample_id[i]}: {reason}", None))
        return ~bad

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Moves every assigned partition back to `offsets` (the beginning where absent)."""
        self.start_offsets = dict(offsets)
        for p in sorted(self.assigned):
            self._consumer.seek(TopicPartition(self.topic, p, self.start_offsets.get((self.topic, p),
                                                                                     OFFSET_BEGINNING)))

    def lag(self) -> int:
        """Messages between the consumer's position and the end of its assigned partitions, from the
        high watermarks the fetches already brought (no broker round trip)."""
        total = 0
        for tp in self._consumer.position([TopicPartition(self.topic, p) for p in sorted(self.assigned)]):
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                total += max(0, high - tp.offset)
        return total

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Informational (lag tools): positioning on restart comes from the snapshot, not from here."""
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=False)
        except KafkaException as exc:  # e.g. partitions revoked meanwhile; the snapshot holds the truth
            log.warning("offset commit skipped: %s", exc)

    def close(self) -> None:
        self._consumer.close()


class TrainerOutputs:
    """Dead letters and snapshot announcements."""

    def __init__(self, bootstrap: str, dead_letter_topic: str, snapshots_topic: str, partitions: int = 1) -> None:
        ensure_topics(bootstrap, [dead_letter_topic, snapshots_topic], partitions)
        config = producer_config(bootstrap, linger_ms=5)
        self.dead = AvroProducer(config, dead_letter_topic, "DeadLetter")
        self.snapshots = AvroProducer(config, snapshots_topic, "ModelSnapshot")

    def dead_letter(self, rejected: list[tuple[str, int, int, str, bytes | None]], now_ms: int) -> None:
        for topic, partition, offset, reason, value in rejected:
            self.dead.produce({"stage": "trainer", "reason": reason, "source_topic": topic,
                               "source_partition": partition if partition >= 0 else None,
                               "source_offset": offset if offset >= 0 else None, "key": None, "value": value,
                               "detected_at": now_ms})
        if rejected:
            self.dead.flush()

    def announce(self, record: dict[str, Any]) -> None:
        self.snapshots.produce(record, key=str(record["version"]))
        self.snapshots.flush()
