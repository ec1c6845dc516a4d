"""`rtrec backfill`: a historical range of the interactions topic through the features and,
optionally, the trainer, without disturbing newer live state.

- Features: the feature job runs bounded over the range (flink_jobs.backfill) into a features topic of
  its own, which a loader of its own writes to Redis through the newest-window-wins writer: a window
  older than the live value of its slot changes nothing.
- Samples go to a samples topic of their own, so a live trainer never reads months-old samples as if
  they had just happened.
- The trainer (optional) learns from that topic into a snapshot store and a current-model pointer of
  their own (`<trainer.snapshot_dir>-<run>`, `<redis.key_prefix>:<run>:model:current`); the live
  trainer's snapshots, offsets and pointer are never touched. `rtrec model` commands read the backfill
  model with `RTREC_TRAINER__SNAPSHOT_DIR` and `RTREC_REDIS__KEY_PREFIX` set to those.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from core.kafka import ensure_topics
from core.log_range import AtOffsets, AtTime, Latest, LogRange, Position
from core.settings import Settings
from feature_store.loader import LoaderConfig, LoaderStats, run_loader
from feature_store.redis_store import RedisFeatureStore
from rtrec.job_progress import wait_reporting_reads


@dataclass
class BackfillResult:
    run_id: str
    features_topic: str
    samples_topic: str | None
    loaded: LoaderStats
    trained_samples: int | None = None
    snapshots: list[int] | None = None
    snapshot_dir: Path | None = None
    model_key_prefix: str | None = None


class BackfillError(RuntimeError):
    pass


def range_offsets(bootstrap: str, topic: str, log_range: LogRange,
                  security: Mapping[str, str] | None = None) -> dict[int, tuple[int, int]]:
    """Per partition, the [start, end) offsets the range selects (Kafka resolves a time to the first
    offset whose record timestamp is at or after it)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rtrec-backfill-range",
                         "enable.auto.commit": False, **(security or {})})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        bounds = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in partitions}

        def resolve(position: Position, default: int) -> dict[int, int]:
            match position:
                case AtTime(epoch_ms=ts):
                    found = consumer.offsets_for_times([TopicPartition(topic, p, ts) for p in partitions], timeout=30)
                    return {tp.partition: bounds[tp.partition][1] if tp.offset < 0 else tp.offset for tp in found}
                case AtOffsets():
                    given = position.as_dict()
                    return {p: given.get(p, bounds[p][default]) for p in partitions}
                case Latest():
                    return {p: bounds[p][1] for p in partitions}
            return {p: bounds[p][0] for p in partitions}  # Earliest

        start, end = resolve(log_range.start, 0), resolve(log_range.end, 1)
        return {p: (start[p], max(start[p], end[p])) for p in partitions}
    finally:
        consumer.close()


def run_backfill(settings: Settings, log_range: LogRange, with_samples: bool = True, train: bool = False,
                 say: Callable[[str], None] = print, run_id: str | None = None) -> BackfillResult:
    from flink_jobs.runner import start_job  # the JVM gateway starts here, not at import

    if train and not with_samples:
        raise BackfillError("training needs samples: drop --no-samples")
    run_id = run_id or f"backfill-{time.strftime('%Y%m%d-%H%M%S')}"
    # the run's own features and samples topics, groups, checkpoints and snapshot store; Redis features stay live
    s = settings.namespaced(run_id, topics=("features", "samples"), redis=False)
    k = s.kafka
    offsets = range_offsets(k.bootstrap_servers, k.topics.events, log_range, security=k.security.librdkafka())
    n_events = sum(end - start for start, end in offsets.values())
    if n_events == 0:
        raise BackfillError(
            f"the range selects no records of {k.topics.events} (offsets {offsets}). A time is resolved by "
            "Kafka record timestamp, which only works where timestamps grow with offsets: after older data "
            "was replayed behind newer, give offsets (--from 0:120,1:98) or replay history into a topic of "
            "its own (RTREC_KAFKA__TOPICS__EVENTS)")
    say(f"[backfill] {n_events} records of {k.topics.events} in range (offsets {offsets})")
    ensure_topics(k.bootstrap_servers, [k.topics.features, k.topics.samples, k.topics.dead_letter], k.partitions,
                  security=k.security.librdkafka(), per_topic=k.partitions_of())
    job = start_job(s, resume=False, log_range=log_range, job_id=run_id, with_samples=with_samples)
    say(f"[backfill] job {job.get_job_client().get_job_id()} over {log_range}; features -> {k.topics.features}"
        + (f", samples -> {k.topics.samples}" if with_samples else ""))
    _wait(job, s, offsets, with_samples, say)
    # read_committed: a bounded job's transactions all commit, and the loader waits for them
    loaded = run_loader(LoaderConfig.from_settings(s, isolation_level="read_committed"),
                        RedisFeatureStore.from_settings(s.redis, s.flink), idle_exit_s=3.0)
    say(f"[backfill] {loaded.records} feature records loaded into Redis, {loaded.slots_written} slots updated "
        "(windows older than a slot's live value change nothing)")
    result = BackfillResult(run_id, k.topics.features, k.topics.samples if with_samples else None, loaded)
    if train:
        from gpu_trainer.service import TrainerService

        model_prefix = f"{s.redis.key_prefix}:{run_id}"
        trainer_settings = s.model_copy(update={"redis": s.redis.model_copy(update={"key_prefix": model_prefix})})
        summary = TrainerService.from_settings(trainer_settings).run(idle_exit_s=5.0)
        result.trained_samples, result.snapshots = summary.samples_trained, summary.snapshots
        result.snapshot_dir, result.model_key_prefix = s.trainer.snapshot_dir, model_prefix
        say(f"[backfill] trained {summary.samples_trained} samples; snapshots {summary.snapshots} in "
            f"{s.trainer.snapshot_dir}; current-model pointer under {model_prefix} (the live one is untouched)")
    return result


def _wait(job: object, s: Settings, offsets: Mapping[int, tuple[int, int]], with_samples: bool,
          say: Callable[[str], None]) -> None:
    try:
        wait_reporting_reads(job, s, offsets, say, "backfill")
    except Exception as exc:  # the job's failure, with where its log is
        raise BackfillError(f"backfill job failed: {exc}; see {s.flink.log_dir}") from exc
