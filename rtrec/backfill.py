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

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from feature_store.loader import LoaderStats, run_loader
from feature_store.redis_store import RedisFeatureStore
from rtrec.settings import Settings
from schemas.kafka_io import ensure_topics


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


def backfill_settings(settings: Settings, run_id: str) -> Settings:
    """The run's own topics, job group, checkpoints, loader group, trainer group and snapshot store."""
    k, f, t = settings.kafka, settings.flink, settings.trainer
    topics = k.topics.model_copy(update={"features": f"{k.topics.features}.{run_id}",
                                         "samples": f"{k.topics.samples}.{run_id}"})
    return settings.model_copy(update={
        "kafka": k.model_copy(update={"topics": topics}),
        "flink": f.model_copy(update={"group_id": f"rtrec-{run_id}", "checkpoint_dir": f.checkpoint_dir / run_id,
                                      "loader_group_id": f"rtrec-loader-{run_id}"}),
        "trainer": t.model_copy(update={"group_id": f"rtrec-trainer-{run_id}", "instance_id": run_id,
                                        "snapshot_dir": t.snapshot_dir.with_name(f"{t.snapshot_dir.name}-{run_id}")}),
    })


def range_offsets(bootstrap: str, topic: str, startup: dict[str, str]) -> dict[int, tuple[int, int]]:
    """Per partition, the [start, end) offsets the connector options select (Kafka resolves a time to
    the first offset whose record timestamp is at or after it)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "rtrec-backfill-range",
                         "enable.auto.commit": False})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        bounds = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in partitions}

        def resolve(kind: str, default: int) -> dict[int, int]:
            mode = startup[f"scan.{kind}.mode"]
            if mode == "timestamp":
                ts = int(startup[f"scan.{kind}.timestamp-millis"])
                found = consumer.offsets_for_times([TopicPartition(topic, p, ts) for p in partitions], timeout=30)
                return {tp.partition: bounds[tp.partition][1] if tp.offset < 0 else tp.offset for tp in found}
            if mode == "specific-offsets":
                given = dict(pair.replace("partition:", "").split(",offset:")
                             for pair in startup[f"scan.{kind}.specific-offsets"].split(";"))
                return {p: int(given[str(p)]) if str(p) in given else bounds[p][default] for p in partitions}
            return {p: bounds[p][default] for p in partitions}  # earliest-offset / latest-offset

        start, end = resolve("startup", 0), resolve("bounded", 1)
        return {p: (start[p], max(start[p], end[p])) for p in partitions}
    finally:
        consumer.close()


def run_backfill(settings: Settings, startup: dict[str, str], with_samples: bool = True, train: bool = False,
                 say: Callable[[str], None] = print, run_id: str | None = None) -> BackfillResult:
    from flink_jobs.runner import start_job  # the JVM gateway starts here, not at import

    if train and not with_samples:
        raise BackfillError("training needs samples: drop --no-samples")
    run_id = run_id or f"backfill-{time.strftime('%Y%m%d-%H%M%S')}"
    s = backfill_settings(settings, run_id)
    k = s.kafka
    offsets = range_offsets(k.bootstrap_servers, k.topics.events, startup)
    n_events = sum(end - start for start, end in offsets.values())
    if n_events == 0:
        raise BackfillError(
            f"the range selects no records of {k.topics.events} (offsets {offsets}). A time is resolved by "
            "Kafka record timestamp, which only works where timestamps grow with offsets: after older data "
            "was replayed behind newer, give offsets (--from 0:120,1:98) or replay history into a topic of "
            "its own (RTREC_KAFKA__TOPICS__EVENTS)")
    say(f"[backfill] {n_events} records of {k.topics.events} in range (offsets {offsets})")
    ensure_topics(k.bootstrap_servers, [k.topics.features, k.topics.samples, k.topics.dead_letter], k.partitions)
    job = start_job(s, resume=False, startup=startup, job_id=run_id, with_samples=with_samples)
    say(f"[backfill] job {job.get_job_client().get_job_id()} over {startup}; features -> {k.topics.features}"
        + (f", samples -> {k.topics.samples}" if with_samples else ""))
    _wait(job, s)
    store = RedisFeatureStore(s.redis.url, s.redis.key_prefix, s.redis.ttl_s)
    loaded = run_loader(k.bootstrap_servers, k.topics.features, k.topics.dead_letter, s.flink.loader_group_id,
                        store, s.flink.loader_batch, idle_exit_s=3.0, partitions=k.partitions)
    say(f"[backfill] {loaded.records} feature records loaded into Redis, {loaded.slots_written} slots updated "
        "(windows older than a slot's live value change nothing)")
    result = BackfillResult(run_id, k.topics.features, k.topics.samples if with_samples else None, loaded)
    if train:
        from gpu_trainer.loop import TrainerService

        model_prefix = f"{s.redis.key_prefix}:{run_id}"
        trainer_settings = s.model_copy(update={"redis": s.redis.model_copy(update={"key_prefix": model_prefix})})
        summary = TrainerService(trainer_settings).run(idle_exit_s=5.0)
        result.trained_samples, result.snapshots = summary.samples_trained, summary.snapshots
        result.snapshot_dir, result.model_key_prefix = s.trainer.snapshot_dir, model_prefix
        say(f"[backfill] trained {summary.samples_trained} samples; snapshots {summary.snapshots} in "
            f"{s.trainer.snapshot_dir}; current-model pointer under {model_prefix} (the live one is untouched)")
    return result


def _wait(job: object, s: Settings) -> None:
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            job.wait()  # type: ignore[attr-defined]
            outcome.append(None)
        except BaseException as exc:  # surfaced below with the log location
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    with tqdm(desc="backfill job running", unit="s", file=sys.stderr) as bar:
        while waiter.is_alive():
            waiter.join(1.0)
            bar.update(1)
    if outcome and outcome[0] is not None:
        raise BackfillError(f"backfill job failed: {outcome[0]}; see {s.flink.log_dir}")
