"""The whole loop on the local services, for `rtrec demo`: synthetic (or replayed) events -> Flink
features and samples -> Redis + Kafka -> trainer -> snapshots; a summary and two plots.

Each run works in its own namespace (topics, Redis prefix, snapshot and checkpoint dirs) so its
figures are its own; the previous runs' demo topics, Redis keys and directories are deleted at start.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from core.kafka import delete_topics, ensure_topics
from core.settings import Settings
from feature_store.loader import LoaderConfig, LoaderStats, run_loader
from feature_store.redis_store import RedisFeatureStore
from gpu_trainer.snapshots import SnapshotStore
from rtrec.demo_trainer import TrainerOutcome, TrainerProcess
from rtrec.reports import Comparison, Freshness, compare_with_frozen, demo_plots
from rtrec.services import manager
from rtrec.sources.produce import produce_synthetic
from schemas.kafka_io import read_topic

# A demo run's id, which ends each of its topic names and directories (Settings.namespaced)
DEMO_ID = r"demo-\d{8}-\d{6}-[0-9a-f]{4}"
DEMO_RUN = re.compile(rf"\.{DEMO_ID}$")


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
    samples_trained: int = 0
    comparison: Comparison | None = None
    freshness: Freshness = field(default_factory=lambda: Freshness.of([], [], 0))
    trainer_freshness_s: float | None = None
    trainer_error: str | None = None
    plots: list[Path] = field(default_factory=list)


def delete_old_demo_topics(bootstrap: str, security: Mapping[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {})})
    delete_topics(bootstrap, [t for t in admin.list_topics(timeout=10).topics if DEMO_RUN.search(t)],
                  security=security)


def delete_old_demo_keys(base: Settings) -> int:
    """The Redis keys of earlier demo runs (each run's key prefix is its own), which would stay until
    their TTL (a day by default); returns how many were deleted. Left in place, Redis expires them
    during a later run and rewrites its append-only file with them in it."""
    own = re.compile(rf"{re.escape(base.redis.key_prefix)}:{DEMO_ID}:".encode())
    store = RedisFeatureStore.from_settings(base.redis, base.flink)
    return store.unlink_matching(f"{base.redis.key_prefix}:demo-*", where=lambda key: own.match(key) is not None)


def delete_old_demo_dirs(base: Settings) -> list[Path]:
    """The snapshots (about 70 MB each, one per 5 s) and checkpoints of earlier demo runs; returns those
    deleted. Left in place, every run added about a gigabyte.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> s = Settings(flink={"checkpoint_dir": root / "chk"}, trainer={"snapshot_dir": root / "snapshots"})
    >>> for d in ("snapshots-demo-20261204-071245-7aa0/v000001", "snapshots-mine", "chk/demo-20261204-071245-7aa0",
    ...           "chk/0031aca6"):
    ...     (root / d).mkdir(parents=True)
    >>> sorted(p.relative_to(root).as_posix() for p in delete_old_demo_dirs(s))
    ['chk/demo-20261204-071245-7aa0', 'snapshots-demo-20261204-071245-7aa0']
    >>> sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    ['chk', 'chk/0031aca6', 'snapshots-mine']
    """
    snapshots, checkpoints = base.trainer.snapshot_dir, base.flink.checkpoint_dir
    old = [d for d in snapshots.parent.glob(f"{snapshots.name}-demo-*")
           if re.fullmatch(rf"{re.escape(snapshots.name)}-{DEMO_ID}", d.name)]
    old += [d for d in checkpoints.glob("demo-*") if re.fullmatch(DEMO_ID, d.name)]
    for d in old:
        shutil.rmtree(d, ignore_errors=True)
    return [d for d in old if not d.exists()]


def run_demo(base: Settings, seconds: float, rate: float, say: Callable[[str], None], out_dir: Path) -> DemoResult:
    from flink_jobs.runner import start_job  # the JVM gateway starts here, not at CLI import

    for name, text in manager.up(base.services).items():
        say(f"[services] {name}: {text}")
    run_id = "demo-" + time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    s = base.namespaced(run_id)
    s = s.model_copy(update={"synthetic": s.synthetic.model_copy(update={"events_per_second_event_time": rate})})
    result = DemoResult(run_id)
    k = s.kafka
    delete_old_demo_topics(k.bootstrap_servers, security=k.security.librdkafka())
    delete_old_demo_dirs(base)
    delete_old_demo_keys(base)
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), k.partitions,
                  security=k.security.librdkafka(), per_topic=k.partitions_of())
    stop = threading.Event()
    say(f"[flink] starting the feature job (embedded mini-cluster), run {run_id}")
    job = start_job(s, resume=False)
    client = job.get_job_client()
    store = RedisFeatureStore.from_settings(s.redis, s.flink)
    loader_stats: list[LoaderStats] = []
    loader = threading.Thread(target=lambda: loader_stats.append(run_loader(
        LoaderConfig.from_settings(s), store, should_stop=stop.is_set)), name="redis-loader")
    trainer = TrainerProcess(s.model_copy(update={"trainer": s.trainer.model_copy(update={
        "snapshot_every_s": 5.0, "batch_timeout_ms": 200, "keep_last": 1000})}))  # the frozen baseline is v1
    try:  # whatever fails from here, the finally stops what was started
        loader.start()
        trainer.start()
        begin_ms = int(time.time() * 1000)
        end_ms = begin_ms + int(seconds * 1000)
        deadline = time.monotonic() + seconds + _label_delay_s(s) + 120
        say(f"[produce] {seconds:.0f} s of synthetic events, {rate:.0f} impressions/s plus their clicks, sent as "
            f"their event time comes (event time = wall clock); then on until the trainer has the samples of the "
            f"last of them: a sample waits {_label_delay_s(s):.0f} s of event time for its label")

        def reported() -> bool:
            caught_up = (trainer.newest_event_ms or 0) >= end_ms
            return caught_up or time.monotonic() > deadline or not trainer.is_alive()

        summary = produce_synthetic(s, None, start_ms=begin_ms, progress=True, live=True, should_stop=reported)
        result.events = summary.produced
        if (trainer.newest_event_ms or 0) < end_ms:
            say("[produce] stopped before the trainer had the samples of the last impressions: the job or the "
                "trainer fell behind, or the trainer stopped")
        say("[wait] until the trainer has read every sample the job wrote")
        _wait_for_trainer(trainer, say, quiet_s=max(10.0, 2 * s.flink.checkpoint_interval_ms / 1000))
    except KeyboardInterrupt:
        say("[demo] interrupted: stopping cleanly")
    finally:
        stop.set()
        outcome = trainer.stop()
        if loader.is_alive():
            loader.join(30)
        with contextlib.suppress(Exception):
            client.cancel().result()
    result.trainer_error = outcome.error
    _collect(s, result, outcome, loader_stats, store)
    result.plots = demo_plots(result.comparison, result.freshness, out_dir)
    return result


def _label_delay_s(s: Settings) -> float:
    """How far a sample trails the newest event: it is written once the watermark has passed the base
    window holding the end of its impression's attribution window."""
    f = s.flink
    return f.attribution_window_s + f.window_s + f.watermark_delay_ms / 1000


def _wait_for_trainer(trainer: TrainerProcess, say: Callable[[str], None], quiet_s: float = 10.0,
                      at_most_s: float = 300.0) -> None:
    """Until the trainer has trained nothing new for `quiet_s`: it has read every sample the job wrote
    (they come at each checkpoint)."""
    began = time.monotonic()
    seen, since = trainer.samples_trained, time.monotonic()
    while time.monotonic() - began < at_most_s and trainer.is_alive():
        time.sleep(1.0)
        now = trainer.samples_trained
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    if trainer.is_alive():
        say(f"[wait] the trainer was still training after {at_most_s:.0f} s; stopping it")
    else:
        say("[wait] the trainer stopped before it had read every sample (its error is in the log above)")


def _collect(s: Settings, result: DemoResult, trainer: TrainerOutcome, loader_stats: list[LoaderStats],
             store: RedisFeatureStore) -> None:
    k = s.kafka
    samples = read_topic(k.bootstrap_servers, k.topics.samples, "TrainingSample",
                         security=k.security.librdkafka()).records
    result.samples = len(samples)
    result.dead_letters = len(read_topic(k.bootstrap_servers, k.topics.dead_letter, "DeadLetter",
                                         security=k.security.librdkafka()).records)
    if loader_stats:
        result.feature_records = loader_stats[0].records
        result.redis_slots = loader_stats[0].slots_written
        result.freshness = Freshness.of(loader_stats[0].latencies_ms, loader_stats[0].horizons_s,
                                        s.flink.watermark_delay_ms, loader_stats[0].received_ms)
    result.redis_keys = sum(1 for _ in store.client.scan_iter(f"{s.redis.key_prefix}:f:*", count=10_000))
    result.snapshots, result.promoted = trainer.written, trainer.promoted
    result.samples_trained = trainer.samples_trained
    snapshots = SnapshotStore(s.trainer.snapshot_dir)
    if trainer.promoted:
        last = snapshots.manifest(trainer.promoted[-1])
        if last.newest_event_ms is not None:
            result.trainer_freshness_s = (last.created_at - last.newest_event_ms) / 1000.0
        kept = [v for v in trainer.promoted if v in snapshots.versions()]
        if kept and trainer.scores:  # the leading learner's scores (a shadow variant may have taken the lead)
            result.comparison = compare_with_frozen(snapshots, kept[0], samples, trainer.scores)
