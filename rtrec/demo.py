"""The whole loop on the local services, for `rtrec demo`: synthetic (or replayed) events -> Flink
features and samples -> Redis + Kafka -> trainer -> snapshots; a summary and two plots.

Each run works in its own namespace (topics, Redis prefix, snapshot and checkpoint dirs) so its
figures are its own; the previous run's demo topics are deleted at start.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka.admin import AdminClient

from feature_store.loader import LoaderStats, run_loader
from feature_store.redis_store import RedisFeatureStore
from gpu_trainer.loop import TrainerService
from gpu_trainer.metrics import auc
from gpu_trainer.scoring import load_snapshot
from gpu_trainer.snapshots import SnapshotStore
from rtrec.services import manager
from rtrec.settings import Settings
from rtrec.sources.produce import produce_synthetic
from schemas.kafka_io import ensure_topics, read_topic

DEMO_TOPIC_PREFIX = "rtrec.demo."


@dataclass
class DemoResult:
    run_id: str
    events: int = 0
    feature_records: int = 0
    redis_slots: int = 0
    redis_keys: int = 0
    samples: int = 0
    dead_letters: int = 0
    snapshots: list[int] = field(default_factory=list)
    promoted: list[int] = field(default_factory=list)
    auc_history: list[dict[str, Any]] = field(default_factory=list)
    frozen_auc: list[tuple[int, float]] = field(default_factory=list)
    feature_latency_ms: list[int] = field(default_factory=list)
    trainer_freshness_s: float | None = None
    plots: list[Path] = field(default_factory=list)


def namespaced(settings: Settings, run_id: str) -> Settings:
    topics = settings.kafka.topics.under(f"{DEMO_TOPIC_PREFIX}{run_id}.")
    state = settings.services.state_dir / "demo" / run_id
    return settings.model_copy(update={
        "kafka": settings.kafka.model_copy(update={"topics": topics}),
        "redis": settings.redis.model_copy(update={"key_prefix": f"rtrec-demo-{run_id}"}),
        "trainer": settings.trainer.model_copy(update={"snapshot_dir": state / "snapshots",
                                                       "group_id": f"rtrec-demo-{run_id}-trainer"}),
        "flink": settings.flink.model_copy(update={"checkpoint_dir": state / "checkpoints",
                                                   "group_id": f"rtrec-demo-{run_id}-features",
                                                   "loader_group_id": f"rtrec-demo-{run_id}-loader"}),
    })


def delete_old_demo_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    old = [t for t in admin.list_topics(timeout=10).topics if t.startswith(DEMO_TOPIC_PREFIX)]
    if old:
        for future in admin.delete_topics(old, operation_timeout=30).values():
            with contextlib.suppress(Exception):
                future.result()


def run_demo(base: Settings, seconds: float, rate: float, say: Callable[[str], None], out_dir: Path) -> DemoResult:
    from flink_jobs.runner import start_job  # the JVM gateway starts here, not at CLI import

    for name, text in manager.up(base.services).items():
        say(f"[services] {name}: {text}")
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    s = namespaced(base, run_id)
    s = s.model_copy(update={"synthetic": s.synthetic.model_copy(update={"events_per_second_event_time": rate})})
    result = DemoResult(run_id)
    k = s.kafka
    delete_old_demo_topics(k.bootstrap_servers)
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), k.partitions)
    stop = threading.Event()
    say(f"[flink] starting the feature job (embedded mini-cluster), run {run_id}")
    job = start_job(s, resume=False)
    client = job.get_job_client()
    store = RedisFeatureStore(s.redis.url, s.redis.key_prefix, s.redis.ttl_s)
    loader_stats: list[LoaderStats] = []
    loader = threading.Thread(target=lambda: loader_stats.append(run_loader(
        k.bootstrap_servers, k.topics.features, k.topics.dead_letter, s.flink.loader_group_id, store,
        s.flink.loader_batch, should_stop=stop.is_set, partitions=k.partitions,
        isolation_level=s.flink.loader_isolation)), name="redis-loader")
    trainer = TrainerService(s.model_copy(update={"trainer": s.trainer.model_copy(update={
        "snapshot_every_s": 5.0, "batch_timeout_ms": 200, "keep_last": 1000})}))  # the frozen baseline is v1
    trained: list[Any] = []
    trainer_thread = threading.Thread(target=lambda: trained.append(trainer.run(should_stop=stop.is_set)),
                                      name="trainer")
    loader.start()
    trainer_thread.start()
    try:
        say(f"[produce] {int(rate * seconds)} synthetic events, {rate:.0f} impressions/s plus their clicks, "
            "sent as their event time comes (event time = wall clock)")
        summary = produce_synthetic(s, int(rate * seconds), progress=True, live=True)
        result.events = summary.produced
        # let the last windows close: push the watermark past them with a final quiet wait
        say("[wait] letting windows, samples and snapshots catch up")
        time.sleep(s.flink.attribution_window_s + 10)
    except KeyboardInterrupt:
        say("[demo] interrupted: stopping cleanly")
    finally:
        stop.set()
        trainer_thread.join(60)
        loader.join(30)
        with contextlib.suppress(Exception):
            client.cancel().result()
    _collect(s, result, trainer, loader_stats, store)
    result.plots = _plots(result, out_dir)
    return result


def _collect(s: Settings, result: DemoResult, trainer: TrainerService, loader_stats: list[LoaderStats],
             store: RedisFeatureStore) -> None:
    k = s.kafka
    samples = read_topic(k.bootstrap_servers, k.topics.samples, "TrainingSample").records
    result.samples = len(samples)
    result.dead_letters = len(read_topic(k.bootstrap_servers, k.topics.dead_letter, "DeadLetter").records)
    if loader_stats:
        result.feature_records = loader_stats[0].records
        result.redis_slots = loader_stats[0].slots_written
        result.feature_latency_ms = loader_stats[0].latencies_ms
    result.redis_keys = sum(1 for _ in store.client.scan_iter(f"{s.redis.key_prefix}:f:*", count=10_000))
    result.snapshots, result.promoted = trainer.written, trainer.promoted
    result.auc_history = trainer.learner.prequential.history
    snapshots = SnapshotStore(s.trainer.snapshot_dir)
    if trainer.promoted:
        last = snapshots.manifest(trainer.promoted[-1])
        if last.newest_event_ms is not None:
            result.trainer_freshness_s = (last.created_at - last.newest_event_ms) / 1000.0
        kept = [v for v in trainer.promoted if v in snapshots.versions()]
        if kept:
            result.frozen_auc = _frozen_auc(snapshots, kept[0], samples)


def _frozen_auc(snapshots: SnapshotStore, version: int, samples: list[dict]) -> list[tuple[int, float]]:
    """AUC over time of the first promoted snapshot, never updated, on the samples after it."""
    frozen = load_snapshot(snapshots, version)
    later = [r for r in samples if r["event_time"] > frozen.manifest.newest_event_ms]
    if not later:
        return []
    dense = np.asarray([r["features"] for r in later], dtype=np.float32)
    probs = frozen.score_arrays([r["user_id"] for r in later], [r["item_id"] for r in later], dense)
    times = np.array([r["event_time"] for r in later])
    labels = np.array([r["label"] for r in later])
    edges = np.linspace(times.min(), times.max() + 1, 11)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        mask = (times >= lo) & (times < hi)
        value = auc(probs[mask].astype(np.float64), labels[mask]) if mask.sum() > 50 else None
        if value is not None:
            out.append((int(hi), value))
    return out


def _plots(result: DemoResult, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(8, 4))
    points = [(h["at_ms"], h["auc"]) for h in result.auc_history if h["auc"] is not None and h["at_ms"]]
    if points:
        # batches may end at slightly earlier event times than their predecessors: plot the running max
        times = np.maximum.accumulate([t for t, _ in points])
        points = list(zip(times.tolist(), [a for _, a in points], strict=True))
        t0 = points[0][0]
        ax.plot([(t - t0) / 1000 for t, _ in points], [a for _, a in points], label="real-time (prequential)")
        if result.frozen_auc:
            ax.plot([(t - t0) / 1000 for t, _ in result.frozen_auc], [a for _, a in result.frozen_auc], "o--",
                    label="frozen first snapshot")
    ax.set_xlabel("event time since the first sample (s)")
    ax.set_ylabel("AUC")
    ax.set_title("Prequential AUC (rolling window): real-time model vs frozen first snapshot")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "auc_over_time.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    lat = np.array(result.feature_latency_ms) / 1000.0
    if len(lat):
        ax.hist(lat, bins=50)
        ax.set_title(f"Feature freshness: window end -> readable in Redis (p50 {np.median(lat):.2f}s, "
                     f"p99 {np.percentile(lat, 99):.2f}s)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("feature records")
    fig.tight_layout()
    paths.append(out_dir / "feature_freshness.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
