"""The trainer's Kafka side: the samples source (positioned from the snapshot's offsets) and the
outputs (dead letters, snapshot announcements). Nothing here touches the network before `start`
or `open`, so building a service is free and its logic is testable without a broker."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from core.group_watch import GroupWatch
from core.kafka import cached_lag, ensure_topics, producer_config
from core.settings import KafkaSettings, TrainerSettings
from gpu_trainer.batch import COLUMN_SOURCES, HISTORY_SOURCES, ID_FIELDS
from gpu_trainer.distributed import Ranks
from schemas.bulk import BulkDecoder
from schemas.dead_letter import Reject, dead_letter
from schemas.feature_set import FEATURE_NAMES
from schemas.kafka_io import AvroConsumer, AvroProducer, ConsumedBatch, read_topic

log = logging.getLogger("rtrec.trainer")
FENCED_WINDOW_S = 600.0
MAX_JOINS_AFTER_FENCING = 3  # within FENCED_WINDOW_S


def history_fields(trainer: TrainerSettings) -> tuple[str, ...]:
    """The recent-engagement fields the configured model reads: none, the items, or (din) all three."""
    if not trainer.history_length:
        return ()
    return HISTORY_SOURCES if trainer.model == "din" else HISTORY_SOURCES[:1]


def fetch_properties(trainer: TrainerSettings) -> dict[str, int]:
    """The samples consumer's read-ahead, from the trainer's settings.

    >>> fetch_properties(TrainerSettings(prefetch_messages=5000))["queued.min.messages"]
    5000
    """
    return {"max.partition.fetch.bytes": trainer.fetch_partition_max_bytes,
            "fetch.max.bytes": max(trainer.fetch_partition_max_bytes, 50 << 20),
            "queued.min.messages": trainer.prefetch_messages}


class KafkaSampleSource:
    """Consumes TrainingSamples as group `group_id`; every assigned partition starts at the offset
    given to `start` (the loaded snapshot's), or at the beginning when it has none, so a restart
    neither skips nor repeats a sample whatever the group's committed offsets say. A partition assigned
    again later (the group rejoining after the broker restarted) resumes after the last record polled:
    the samples polled since the snapshot are already in the model."""

    def __init__(self, bootstrap: str, topic: str, group_id: str, instance_id: str | None = None,
                 session_timeout_ms: int = 10_000, security: Mapping[str, str] | None = None,
                 ranks: Ranks | None = None, n_features: int = len(FEATURE_NAMES),
                 history_fields: tuple[str, ...] = HISTORY_SOURCES,
                 fetch: Mapping[str, int] | None = None) -> None:
        """`fetch`: librdkafka properties for reading ahead (`fetch_properties`)."""
        self.topic = topic
        # decoded in bulk: per-record decoding in Python capped the service at about 30k samples/s
        # only what the columns hold: each string kept costs a Python object per record
        self._decoder = BulkDecoder("TrainingSample", keep=COLUMN_SOURCES + history_fields)
        self._widths = {"features": n_features}
        self.ranks = ranks  # given: this rank's share of the partitions, assigned without the group protocol
        self.start_offsets: dict[tuple[str, int], int] = {}
        self.assigned: set[int] = set()
        # ranks take their partitions without joining the group, so a static membership would only fence
        # them: every rank's commit under one instance id, or a rank's under the id that the single process
        # before a rescale still holds in the group until its session times out
        self.instance_id = instance_id if ranks is None else None
        config = {"fetch.min.bytes": 1, "session.timeout.ms": session_timeout_ms, **(fetch or {}),
                  **({"group.instance.id": self.instance_id} if self.instance_id else {}), **(security or {})}
        self._new_consumer = lambda: AvroConsumer(bootstrap, group_id, None, "TrainingSample",
                                                  keep_rejected_values=True, **config)
        self._consumer = self._new_consumer()
        self._fenced_at: list[float] = []
        self._membership = GroupWatch(bootstrap, group_id, max(60.0, 6 * session_timeout_ms / 1000), security=security)

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, trainer: TrainerSettings,
                      ranks: Ranks | None = None) -> KafkaSampleSource:
        return cls(kafka.bootstrap_servers, kafka.topics.samples, trainer.group_id, trainer.instance_id,
                   trainer.session_timeout_ms, kafka.security.librdkafka(), ranks,
                   history_fields=history_fields(trainer), fetch=fetch_properties(trainer))

    def start(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.start_offsets = dict(positions)
        if self.ranks is None:
            self._consumer.raw.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
            return
        mine = [TopicPartition(self.topic, p) for p in self.ranks.partitions(self._partition_count())]
        self._on_assign(self._consumer.raw, mine)
        log.info("rank %d of %d consumes partitions %s", self.ranks.rank, self.ranks.world,
                 sorted(self.assigned) or "none (it still takes part in every round)")

    def _partition_count(self, timeout_s: float = 120.0) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            topic = self._consumer.raw.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if topic is not None and topic.error is None and topic.partitions:
                return len(topic.partitions)
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {self.topic} does not exist after {timeout_s:.0f} s: the ranks split its "
                                   "partitions, so it must exist first (rtrec demo and the tests create it)")
            time.sleep(1.0)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            tp.offset = self.start_offsets.get((tp.topic, tp.partition), OFFSET_BEGINNING)
            self.assigned.add(tp.partition)
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.assigned.discard(tp.partition)

    def poll(self, max_records: int, timeout_s: float) -> ConsumedBatch:
        # the service trains (or dead-letters) every batch before it polls again, and a rebalance
        # runs inside a poll: by then everything polled before is in the model
        try:
            # a block's ids stay in its bytes: they are hashed there (gpu_trainer.siphash)
            batch = self._consumer.poll_columns(self._decoder, self._widths, max_records, timeout_s, fill=True,
                                                as_bytes=ID_FIELDS)
        except KafkaException as exc:
            if not (exc.args[0].fatal() or exc.args[0].code() == KafkaError._FATAL):  # a message's error: the code
                raise
            self._join_again(exc)
            return ConsumedBatch([], [], {})
        self.start_offsets.update(batch.offsets)
        if self.ranks is None and self._membership.left_behind(self._consumer.raw, bool(batch.offsets)):
            log.warning("the group %s has settled without the samples consumer, which has had no partitions for "
                        "%.0f s and no error: a new consumer joins from the samples polled last",
                        self._membership.group_id, self._membership.unassigned_for())
            left = self._consumer
            # closing waits for the group coordinator the old consumer has lost: on the side
            threading.Thread(target=left.close, name="left-behind-consumer", daemon=True).start()
            self._start_new_consumer()
            self._membership.restart()
        return batch

    def _join_again(self, exc: KafkaException) -> None:
        """A consumer's one fatal error: its static membership (group.instance.id) fenced. After an outage
        longer than the session, the broker can fence the member that is rejoining by its own earlier
        membership (librdkafka #3437). A new consumer joins as that instance and takes the partitions from
        the samples polled last, which are trained already. Fenced again and again, another process uses the
        same instance id: that needs a person."""
        now = time.monotonic()
        self._fenced_at = [t for t in self._fenced_at if now - t < FENCED_WINDOW_S] + [now]
        if len(self._fenced_at) > MAX_JOINS_AFTER_FENCING:
            raise RuntimeError(f"the samples consumer was fenced {len(self._fenced_at)} times within "
                               f"{FENCED_WINDOW_S:.0f} s: another consumer in the group uses group.instance.id "
                               f"{self.instance_id!r}; give every trainer its own trainer.instance_id") from exc
        log.warning("the samples consumer was fenced (%s); joining the group again as %r from the samples polled "
                    "last", exc.args[0].str(), self.instance_id)
        with contextlib.suppress(Exception):  # a fenced consumer may refuse to close cleanly
            self._consumer.close()
        self._start_new_consumer()

    def _start_new_consumer(self) -> None:
        self._consumer = self._new_consumer()
        self.assigned.clear()
        self.start(self.start_offsets)

    def has_partitions(self) -> bool:
        return bool(self.assigned)

    def seek(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Moves every assigned partition back to `positions` (the beginning where absent)."""
        self.start_offsets = dict(positions)
        for p in sorted(self.assigned):
            self._consumer.raw.seek(TopicPartition(self.topic, p, self.start_offsets.get((self.topic, p),
                                                                                         OFFSET_BEGINNING)))

    def lag(self) -> int:
        return cached_lag(self._consumer.raw, [TopicPartition(self.topic, p) for p in sorted(self.assigned)])

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        try:
            self._consumer.commit(positions)
        except KafkaException as exc:  # e.g. partitions revoked meanwhile; the snapshot holds the truth
            log.warning("offset commit skipped: %s", exc)

    def close(self) -> None:
        self._consumer.close()


class KafkaTrainerOutputs:
    """Dead letters and snapshot announcements; `open` creates the topics."""

    def __init__(self, bootstrap: str, dead_letter_topic: str, snapshots_topic: str, partitions: int = 1,
                 security: Mapping[str, str] | None = None) -> None:
        self._bootstrap, self._partitions, self._security = bootstrap, partitions, dict(security or {})
        config = producer_config(bootstrap, linger_ms=5, **self._security)
        self.dead = AvroProducer(config, dead_letter_topic, "DeadLetter")
        self.snapshots = AvroProducer(config, snapshots_topic, "ModelSnapshot")

    @classmethod
    def from_settings(cls, kafka: KafkaSettings) -> KafkaTrainerOutputs:
        return cls(kafka.bootstrap_servers, kafka.topics.dead_letter, kafka.topics.snapshots, kafka.partitions,
                   kafka.security.librdkafka())

    def open(self) -> KafkaTrainerOutputs:
        ensure_topics(self._bootstrap, [self.dead.topic, self.snapshots.topic], self._partitions,
                      security=self._security)
        return self

    def dead_letter(self, rejects: Sequence[Reject]) -> None:
        now = int(time.time() * 1000)
        for reject in rejects:
            self.dead.produce(dead_letter("trainer", reject, now))
        if rejects:
            self.dead.flush()

    def dead_lettered_since(self, since_ms: int) -> set[bytes]:
        """Reads the dead-letter topic from `since_ms` on: one pass at start, over what came after the
        snapshot resumed from."""
        records = read_topic(self._bootstrap, self.dead.topic, "DeadLetter", since_ms=since_ms,
                             security=self._security).records
        return {r["key"] for r in records if r["stage"] == "trainer" and r["key"] is not None}

    def announce(self, snapshot: Mapping[str, Any]) -> None:
        self.snapshots.produce(snapshot, key=str(snapshot["version"]))
        self.snapshots.flush()
