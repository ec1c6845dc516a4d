"""Kafka transport for every package: client configurations, topic creation, and the one batched
poll loop. Records stay bytes here; `schemas.kafka_io` adds the Avro contracts on top.

All network I/O is batched: producing relies on librdkafka's linger/batching (one `produce` call
per record only enqueues), consuming uses `consume(num_messages=...)`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic

from core.collector import CollectorPause, cyclic_gc_paused

log = logging.getLogger("rtrec.kafka")


def ensure_topics(bootstrap: str, topics: Iterable[str], partitions: int = 2, timeout_s: float = 30.0,
                  security: Mapping[str, str] | None = None, per_topic: Mapping[str, int] | None = None) -> None:
    """Creates the topics that do not exist yet (replication factor 1: a single-node broker), with
    `partitions` each or their count in `per_topic`.

    `security`, here and below: the client's authentication and TLS properties
    (`KafkaSecuritySettings.librdkafka()`)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [NewTopic(t, num_partitions=(per_topic or {}).get(t, partitions), replication_factor=1)
               for t in topics if t not in existing]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"cannot create topic {topic}: {exc}") from exc


def delete_topics(bootstrap: str, topics: Iterable[str], timeout_s: float = 30.0,
                  security: Mapping[str, str] | None = None) -> dict[str, str]:
    """Deletes `topics` (a topic already gone counts as deleted); returns the reason per topic that
    could not be deleted, so that one failure does not keep the others."""
    names = list(topics)
    if not names:
        return {}
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    failed = {}
    for topic, future in admin.delete_topics(names, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                failed[topic] = str(exc)
    return failed


def denied_topic_operations(bootstrap: str, needs: Mapping[str, Iterable[str]], timeout_s: float = 15.0,
                            security: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Of the operations `needs` names per topic (READ, WRITE, ...), those the brokers say this client's
    principal is not allowed (KIP-430's authorized operations; a broker without an authorizer allows
    all). A topic the principal may not even describe lacks DESCRIBE as well. A topic that does not
    exist yet, or a cluster that does not answer in time, is not judged: an empty answer means no ACL
    is known to be missing."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    futures = admin.describe_topics(TopicCollection(list(needs)), request_timeout=timeout_s,
                                    include_authorized_operations=True)
    denied: dict[str, list[str]] = {}
    for topic, future in futures.items():
        wanted = list(dict.fromkeys(needs[topic]))
        try:
            allowed = future.result(timeout=timeout_s + 5).authorized_operations
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                denied[topic] = list(dict.fromkeys([*wanted, "DESCRIBE"]))
            continue
        except TimeoutError:  # judged later, by the clients' own errors
            continue
        if allowed is None:  # a broker too old to say
            continue
        names = {op.name for op in (AclOperation if AclOperation.ALL in allowed else allowed)}
        if missing := [op for op in wanted if op not in names]:
            denied[topic] = missing
    return denied


class KafkaAuthorizationError(PermissionError):
    """An ACL the pipeline needs is missing: no retry helps, a person must grant it."""


class KafkaAuthenticationError(KafkaException):
    """The broker refused the client's credentials: no retry helps, a person must fix the settings."""


def refuse_on_authentication_error(err: KafkaError) -> None:
    """librdkafka reports refused credentials only through the error callback, and then retries
    forever; raised here, the error leaves the poll, flush or consume call that served it. A connection
    lost during the SASL handshake comes with the same code but is transient, and is retried as usual.

    >>> refuse_on_authentication_error(KafkaError(KafkaError._AUTHENTICATION, "GroupCoordinator: SASL OAUTHBEARER "
    ...     "mechanism handshake failed: Local: Broker transport failure: broker's supported mechanisms: (n/a)"))
    """
    if err.code() == KafkaError._AUTHENTICATION and "Broker transport failure" not in err.str():
        raise KafkaAuthenticationError(err)


# librdkafka's default re-bootstrap decommissions the broker handles once every known broker is down,
# the group coordinator's among them. After a 30 s outage of a one-broker cluster, about one run in
# eight here left the Redis loader's consumer with its coordinator request queued and never sent: it
# never rejoined its group and consumed nothing more, without an error (librdkafka issue 5511 and pull
# request 5512 describe the same stale coordinator from the transactional API). Without re-bootstrap
# the client keeps the brokers it knows and reconnects to them, which is what a restarted broker needs.
# A cluster whose brokers all move to new addresses at once needs re-bootstrap: pass
# "metadata.recovery.strategy": "rebootstrap" in the extra config.
_NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}


def producer_config(bootstrap: str, linger_ms: int = 20, batch_size_bytes: int = 1_000_000,
                    compression: str = "lz4", **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "error_cb": refuse_on_authentication_error,
        "linger.ms": linger_ms,
        "batch.size": batch_size_bytes,
        "compression.type": compression,
        "enable.idempotence": True,
        "queue.buffering.max.messages": 1_000_000,
        **_NO_REBOOTSTRAP,
        **extra,
    }


def consumer_config(bootstrap: str, group_id: str, isolation_level: str = "read_committed",
                    auto_offset_reset: str = "earliest", **extra: Any) -> dict[str, Any]:
    """Offsets are never committed automatically: every consumer here commits after its work is done."""
    return {
        "bootstrap.servers": bootstrap,
        "error_cb": refuse_on_authentication_error,
        "group.id": group_id,
        "auto.offset.reset": auto_offset_reset,
        "enable.auto.commit": False,
        "isolation.level": isolation_level,
        **_NO_REBOOTSTRAP,
        **extra,
    }


# Errors a client sees while a broker restarts or moves a partition: they pass, so they are retried.
_TRANSIENT = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD,
              KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
              KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REBALANCE_IN_PROGRESS,
              KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NETWORK_EXCEPTION,
              KafkaError._NO_OFFSET}


def is_transient(error: KafkaError) -> bool:
    """Whether an error passes by itself (a broker restarting), as opposed to one that needs a person."""
    return not error.fatal() and (error.retriable() or error.code() in _TRANSIENT)


_MISSING_TOPIC_WARN_EVERY_S = 30.0
_missing_topic_warned: dict[str, float] = {}


def _waiting_for_topic(err: KafkaError) -> None:
    """A subscribed topic that does not exist yet (the job that writes it has not started): consumers
    wait for it, as Kafka's own do, saying so now and then so that a misspelt name is seen."""
    now = time.monotonic()
    text = err.str()
    if now - _missing_topic_warned.get(text, -_MISSING_TOPIC_WARN_EVERY_S) >= _MISSING_TOPIC_WARN_EVERY_S:
        _missing_topic_warned[text] = now
        log.warning("waiting for the topic to be created: %s", text)


def poll_messages(consumer: Consumer, max_records: int, timeout_s: float, fill: bool = False,
                  pause: CollectorPause | None = None) -> list[Message]:
    """Up to `max_records` messages within `timeout_s`; end-of-partition events are skipped, errors raised
    (but for transient ones and a subscribed topic that does not exist yet, which are waited out).

    With `fill`, waits for more until `max_records` arrived or the time is up (a micro-batch that closes
    on size or time); without, returns what has arrived as soon as anything has.

    The messages are taken with the collector paused (core.collector): in `pause`, the caller's, which
    then lasts until the caller has dropped them, else in one of its own. Waits run with it going.
    """
    if pause is None:
        with cyclic_gc_paused() as own:
            return poll_messages(consumer, max_records, timeout_s, fill, own)
    deadline = time.monotonic() + timeout_s
    out: list[Message] = []
    while len(out) < max_records:
        got = consumer.consume(num_messages=max_records - len(out), timeout=0)  # what the fetches brought
        if not got:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (out and not fill):
                break
            with pause.waiting():
                got = consumer.consume(num_messages=1, timeout=remaining)  # returns as soon as one arrives
            if not got:
                break
        for msg in got:
            err = msg.error()
            if err is None:
                out.append(msg)
            elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                _waiting_for_topic(err)
            elif err.code() != KafkaError._PARTITION_EOF and not is_transient(err):
                raise KafkaException(err)  # transient ones: librdkafka reconnects and fetches again
    return out


def cached_lag(consumer: Consumer, partitions: list[TopicPartition]) -> int:
    """Records between the consumer's positions and the ends of `partitions`, from the high
    watermarks its fetches already brought (no broker round trip)."""
    total = 0
    for tp in consumer.position(partitions):
        _low, high = consumer.get_watermark_offsets(tp, cached=True)
        if tp.offset >= 0 and high >= 0:
            total += max(0, high - tp.offset)
    return total


def group_lag(bootstrap: str, group_id: str, topic: str, timeout_s: float = 10.0,
              security: Mapping[str, str] | None = None) -> dict[int, int]:
    """Per partition, the records between the group's committed offset (the partition's start when it
    has none) and the partition's end; read without joining the group."""
    consumer = Consumer(consumer_config(bootstrap, group_id, **(security or {})))
    try:
        lag = {}
        for partition, offset in _committed(consumer, topic, timeout_s).items():
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
            lag[partition] = high - (offset if offset >= 0 else low)
        return lag
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group_id: str, topic: str, timeout_s: float = 10.0,
                      security: Mapping[str, str] | None = None) -> dict[int, int]:
    """Per partition, the group's committed offset (-1 where it has none); read without joining the group."""
    consumer = Consumer(consumer_config(bootstrap, group_id, **(security or {})))
    try:
        return _committed(consumer, topic, timeout_s)
    finally:
        consumer.close()


def _committed(consumer: Consumer, topic: str, timeout_s: float) -> dict[int, int]:
    partitions = sorted(consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
    found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
    return {tp.partition: tp.offset for tp in found}
