"""Feeds Redis from the features topic: large batches, one pipeline per batch.

Why a loader and not a sink inside the Flink job: a Python operator in the job moved 7-11k rows/s
here, while this loader writes from outside the JVM at the Redis pipeline's rate, and scales by
adding loaders to the consumer group (one per partition). Exactly-once into Redis comes from the
newest-window-wins script: a replayed record can never overwrite a newer window, so consuming at
least once (commit after the Redis write) leaves the same state as exactly once. For the same
reason it may read uncommitted records (the default in Settings.flink.loader_isolation): windows
reach Redis when the job sends them instead of at the next checkpoint.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import redis
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from core.group_watch import GroupWatch
from core.kafka import cached_lag, ensure_topics, is_transient, producer_config
from core.settings import FlinkSettings, Settings
from feature_store.base import FeatureWriter
from feature_store.columns import FeatureColumns
from feature_store.commits import CommitsFailing, DurableCommits, refused_by_group
from feature_store.telemetry import LoaderMetrics
from feature_store.validation import check_records
from schemas.bulk import BulkDecoder
from schemas.dead_letter import dead_letter
from schemas.kafka_io import AvroConsumer, AvroProducer

log = logging.getLogger("rtrec.loader")
T = TypeVar("T")


@dataclass
class LoaderStats:
    records: int = 0
    slots_written: int = 0
    rejected: int = 0
    batches: int = 0
    # per record, the newest million (a loader runs for weeks): wall-clock ms when it became readable
    # in Redis minus its window end, and the record's horizon (0: a user's recent list)
    latencies_ms: deque[int] = field(default_factory=lambda: deque(maxlen=1_000_000))
    horizons_s: deque[int] = field(default_factory=lambda: deque(maxlen=1_000_000))
    # per record likewise: when its poll handed it to the loader (fetched and decoded) minus its window
    # end, which splits the latency into the job's and Kafka's part and the loader's and Redis's
    received_ms: deque[int] = field(default_factory=lambda: deque(maxlen=1_000_000))
    # time in Redis writes: wall-clock seconds, and the loader thread's own CPU seconds in them (the
    # rest is Redis's work and waiting for a core)
    write_s: float = 0.0
    write_cpu_s: float = 0.0


@dataclass(frozen=True)
class LoaderConfig:
    bootstrap: str
    topic: str
    dead_letter_topic: str
    group_id: str
    batch: int = 20_000
    partitions: int = 2
    isolation_level: str = "read_committed"
    # a poll returns after this long with what has arrived: a record waits at most that long for Redis
    poll_timeout_s: float = 0.05
    # how long Redis or Kafka may be unreachable before the loader gives up (LoaderError, a non-zero exit)
    outage_s: float = 300.0
    # the consumer group session (FlinkSettings.loader_session_timeout_ms says why it is short)
    session_timeout_ms: int = 10_000
    # offsets are committed this long after their records were written: Redis's appendfsync everysec
    # can lose up to about two seconds of writes when it is killed
    commit_lag_s: float = 2.5
    # rebuild: read every partition from its beginning, whatever the group committed (Redis was lost);
    # newest-window-wins makes writing old windows again harmless
    from_beginning: bool = False
    # the Kafka clients' authentication and TLS (KafkaSecuritySettings.librdkafka())
    security: Mapping[str, str] = field(default_factory=dict)
    # without partitions this long, the loader asks the group coordinator whether its consumer is still
    # a member, and replaces a consumer the group left behind (core.group_watch says why)
    rejoin_check_s: float = 60.0
    # a record whose window starts this long after now is dead-lettered (the job's own bound on event
    # times); None: no bound
    max_future_skew_ms: int | None = FlinkSettings.model_fields["max_future_skew_ms"].default

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LoaderConfig:
        k, f = settings.kafka, settings.flink
        return replace(cls(k.bootstrap_servers, k.topics.features, k.topics.dead_letter, f.loader_group_id,
                           f.loader_batch, k.partitions, f.loader_isolation, outage_s=f.loader_outage_s,
                           session_timeout_ms=f.loader_session_timeout_ms, security=k.security.librdkafka(),
                           max_future_skew_ms=f.max_future_skew_ms),
                       **overrides)


class LoaderError(RuntimeError):
    """The loader cannot go on (an outage longer than its bound, or an error that needs a person)."""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.BusyLoadingError):
        return True
    return isinstance(exc, KafkaException) and is_transient(exc.args[0])


def retrying(what: str, action: Callable[[], T], outage_s: float, sleep: Callable[[float], None] = time.sleep,
             on_recovery: Callable[[], None] | None = None, on_retry: Callable[[str], None] | None = None) -> T:
    """`action()`, retried with backoff (0.1 s doubling to 5 s) while it fails transiently, for at most
    `outage_s`; then LoaderError with the cause. Other errors pass through at once. `on_recovery` runs
    when it succeeds after having failed."""
    began, delay, failed = time.monotonic(), 0.1, False
    while True:
        try:
            result = action()
            if failed and on_recovery is not None:
                on_recovery()
            return result
        except Exception as exc:
            if not _transient(exc):
                raise
            if time.monotonic() - began > outage_s:
                raise LoaderError(f"{what} failed for {outage_s:.0f} s, giving up: {exc}") from exc
            failed = True
            if on_retry is not None:
                on_retry(what)
            log.warning("%s failed (%s); retrying in %.1f s", what, exc, delay)
            sleep(delay)
            delay = min(delay * 2, 5.0)


def run_loader(config: LoaderConfig, store: FeatureWriter, should_stop: Callable[[], bool] = lambda: False,
               idle_exit_s: float | None = None, on_batch: Callable[[LoaderStats], None] | None = None,
               metrics: LoaderMetrics | None = None) -> LoaderStats:
    """Consumes until `should_stop()` or `idle_exit_s` without records. Order per batch: undecodable
    records and those no slot can hold (feature_store.validation) to the dead-letter topic, good ones
    to Redis (one pipeline, retried through an outage of up to `outage_s`), and `commit_lag_s` later,
    once Redis has its append-only file on disk, the offsets committed. After Redis was unreachable
    (it may have restarted and lost its last second), the loader goes back to the committed offsets
    and writes what follows again; newest-window-wins makes that harmless. A backlog comes in full
    batches. `metrics` (when given) are kept up to date."""
    c = config
    m = metrics or LoaderMetrics()

    def retried(what: str) -> None:
        m.retries.labels(what=what).inc()

    def send(offsets: dict[tuple[str, int], int]) -> None:
        consumer.raw.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=True)

    def fresh_commits() -> DurableCommits:
        return DurableCommits(send, c.commit_lag_s, c.outage_s, on_failure=lambda: retried("committing offsets"))

    commits = fresh_commits()
    ensure_topics(c.bootstrap, [c.topic], c.partitions, security=c.security)
    rewound: set[int] = set()
    stats = LoaderStats()

    def on_assign(raw: Any, partitions: list[TopicPartition]) -> None:
        if c.from_beginning:  # each partition once: a later rebalance resumes from the commits
            for tp in partitions:
                if tp.partition not in rewound:
                    tp.offset = OFFSET_BEGINNING
                    rewound.add(tp.partition)
        raw.assign(partitions)
        log.info("partitions assigned: %s", sorted(tp.partition for tp in partitions))

    def taken(how: str, its_commits: DurableCommits) -> Callable[[Any, list[TopicPartition]], None]:
        def on_taken(raw: Any, partitions: list[TopicPartition]) -> None:
            its_commits.forget()
            log.info("partitions %s: %s", how, sorted(tp.partition for tp in partitions))
        return on_taken

    def subscribed(its_commits: DurableCommits) -> AvroConsumer:
        """A consumer of the topic whose commit results and lost partitions go to `its_commits`."""
        new = AvroConsumer(c.bootstrap, c.group_id, None, "FeatureRecord", isolation_level=c.isolation_level,
                           **{"fetch.min.bytes": 1, "fetch.wait.max.ms": 50, "on_commit": its_commits.on_commit,
                              "session.timeout.ms": c.session_timeout_ms, **c.security})
        new.raw.subscribe([c.topic], on_assign=on_assign, on_revoke=taken("revoked", its_commits),
                          on_lost=taken("lost", its_commits))
        return new

    consumer = subscribed(commits)
    membership = GroupWatch(c.bootstrap, c.group_id, c.rejoin_check_s, security=c.security)
    dead = AvroProducer(producer_config(c.bootstrap, linger_ms=5, **c.security), c.dead_letter_topic, "DeadLetter")

    def commit_unless_moved_on(offsets: dict[tuple[str, int], int]) -> None:
        try:
            consumer.commit(offsets)
        except KafkaException as exc:
            if not refused_by_group(exc.args[0]):
                raise

    def back_to_committed() -> None:
        commits.forget()
        assigned = consumer.raw.assignment()
        for tp in consumer.raw.committed(assigned, timeout=30) if assigned else []:
            tp.offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.raw.seek(tp)
        log.warning("Redis is back: writing again from the committed offsets, which it had on disk")

    decoder = BulkDecoder("FeatureRecord")
    last = lag_at = time.monotonic()
    try:
        while not should_stop():
            got = consumer.poll_columns(decoder, {}, max_records=c.batch, timeout_s=c.poll_timeout_s)
            received_at = int(time.time() * 1000)
            assert got.columns is not None
            batch = FeatureColumns.of_decoded(got.columns)
            latest_start = None if c.max_future_skew_ms is None else received_at + c.max_future_skew_ms
            usable, refused = check_records(batch, c.topic, latest_start)
            batch = batch.where(usable)
            got.rejected += refused
            if len(batch):  # the same batch is written until it is in Redis: offsets only move after that
                wall, cpu = time.perf_counter(), time.thread_time()
                slots = retrying("writing to Redis", functools.partial(store.write_columns, batch),
                                 c.outage_s, on_recovery=back_to_committed, on_retry=retried)
                cpu_s = time.thread_time() - cpu  # read inside the wall-clock span, so never above it
                readable_at = int(time.time() * 1000)
                stats.write_s += time.perf_counter() - wall
                stats.write_cpu_s += cpu_s
                stats.received_ms.extend((received_at - batch.window_end).tolist())
                latencies = readable_at - batch.window_end
                stats.latencies_ms.extend(latencies.tolist())
                stats.horizons_s.extend(batch.horizon_s.tolist())
                latencies.sort()  # for the metrics' quantiles, after the per-record figures are kept
                stats.slots_written += slots
                stats.records += len(batch)
                stats.batches += 1
                m.records.inc(len(batch))
                m.slots.inc(slots)
                m.last_batch.set(readable_at / 1000)
                m.freshness.labels(quantile="0.5").set(int(latencies[len(latencies) // 2]) / 1000)
                m.freshness.labels(quantile="1").set(int(latencies[-1]) / 1000)
            if got.rejected:
                now = int(time.time() * 1000)
                for reject in got.rejected:
                    dead.produce(dead_letter("redis-loader", reject, now))
                retrying("writing dead letters", dead.flush, c.outage_s, on_retry=retried)
                stats.rejected += len(got.rejected)
                m.dead_lettered.inc(len(got.rejected))
            if got.offsets or not consumer.raw.assignment():  # idle time counts once partitions are ours
                last = time.monotonic()
            if got.offsets:
                commits.written(got.offsets)
                if on_batch is not None:
                    on_batch(stats)
            elif idle_exit_s is not None and time.monotonic() - last > idle_exit_s:
                break
            try:
                commits.due()
            except CommitsFailing as exc:
                raise LoaderError(f"{exc}, giving up") from exc
            if time.monotonic() - lag_at >= 1.0:
                lag_at = time.monotonic()
                m.lag.set(cached_lag(consumer.raw, consumer.raw.assignment()))
            if membership.left_behind(consumer.raw):
                log.warning("the group %s has settled without this loader's consumer, which has had no partitions "
                            "for %.0f s and no error: starting a new consumer", c.group_id, membership.unassigned_for())
                retried("rejoining the group")
                # what the old consumer wrote but did not commit is read again from the last commit; its
                # commit under way answers (if ever) to the old DurableCommits. Closed on the side: closing
                # a consumer waits for its group coordinator, which it has lost.
                left, commits = consumer, fresh_commits()
                threading.Thread(target=left.close, name="left-behind-consumer", daemon=True).start()
                consumer = subscribed(commits)
                membership.restart()
                last = time.monotonic()
        if commits.pending:  # a clean stop: wait until Redis has the last writes on disk, then commit them
            time.sleep(commits.durable_in())
            commits.commit_all_now(lambda offsets: retrying(
                "committing offsets", functools.partial(commit_unless_moved_on, offsets), c.outage_s,
                on_retry=retried))
    finally:
        consumer.close()
    return stats
