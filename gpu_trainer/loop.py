"""The trainer service: consume micro-batches, `Learner.step` each, checkpoint periodically.

At start it loads the latest snapshot (weights, EMA, EWC state, sample count) and consumes from
that snapshot's offsets, so after a crash (even `kill -9`) every sample is trained exactly once in
the lineage of the snapshot the model continues from.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from feature_store.feature_set import FEATURE_NAMES, FEATURE_SET
from gpu_trainer.batch import Columns
from gpu_trainer.consumer import SampleSource, TrainerOutputs
from gpu_trainer.learner import Learner
from gpu_trainer.registry import ModelRegistry
from gpu_trainer.snapshots import Manifest, SnapshotStore, now_ms, should_promote
from gpu_trainer.telemetry import TrainerMetrics
from rtrec.settings import Settings

log = logging.getLogger("rtrec.trainer")


@dataclass
class RunSummary:
    samples_trained: int
    dead_lettered: int
    snapshots: list[int]
    promoted: list[int]
    resumed_from: int | None


class TrainerService:
    def __init__(self, settings: Settings, n_features: int = len(FEATURE_NAMES)) -> None:
        cfg = settings.trainer
        self.settings = settings
        self.cfg = cfg
        self.learner = Learner(cfg, n_features)
        self.store = SnapshotStore(cfg.snapshot_dir)
        self.registry = ModelRegistry(self.store, settings.redis.url, settings.redis.key_prefix)
        self.metrics = TrainerMetrics()
        k = settings.kafka
        self.outputs = TrainerOutputs(k.bootstrap_servers, k.topics.dead_letter, k.topics.snapshots, k.partitions)
        self.version = 0
        self.dead_lettered = 0
        self.positions: dict[tuple[str, int], int] = {}
        self.resumed_from = self._resume()
        self.source = SampleSource(k.bootstrap_servers, k.topics.samples, cfg.group_id, self.positions, n_features,
                                   instance_id=cfg.instance_id, session_timeout_ms=cfg.session_timeout_ms)
        self.newest_event_ms: int | None = None
        self._since_snapshot = 0
        self._dirty = False
        self._reverts = 0
        self._lag_at = 0.0
        self._publisher: threading.Thread | None = None
        self._publishing: tuple[Manifest, dict[tuple[str, int], int]] | None = None
        self._publish_error: BaseException | None = None
        self._last_snapshot_at = time.monotonic()
        self.written: list[int] = []
        self.promoted: list[int] = []

    def _resume(self) -> int | None:
        latest = self.store.latest_version()
        if latest is None:
            return None
        manifest, arrays = self.store.load(latest)
        if manifest.model_name != self.learner.model_name or manifest.model_config != self.learner.config:
            raise RuntimeError(f"snapshot v{latest} holds {manifest.model_name} {manifest.model_config}; the trainer"
                               f" is configured for {self.learner.model_name} {self.learner.config}. Point "
                               "trainer.snapshot_dir elsewhere or match the model settings.")
        self.learner.load_state_arrays(arrays)
        self.learner.samples_trained = manifest.samples_seen
        self.learner.sample_digest = int(manifest.sample_digest, 16)
        self.dead_lettered = manifest.dead_lettered
        self.positions = manifest.offsets_by_partition()
        self.version = latest
        self.newest_event_ms = manifest.newest_event_ms
        log.info("resumed from snapshot v%d: %d samples, offsets %s", latest, manifest.samples_seen, self.positions)
        return latest

    def run(self, max_samples: int | None = None, idle_exit_s: float | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> RunSummary:
        """Trains until `should_stop()`, `max_samples` trained in total, or `idle_exit_s` without input."""
        if self.cfg.metrics_port:
            self.metrics.serve(self.cfg.metrics_port)
        last_input = time.monotonic()
        try:
            while not should_stop():
                if max_samples is not None and self.learner.samples_trained >= max_samples:
                    break
                batch = self.source.poll(self.cfg.batch_size, self.cfg.batch_timeout_ms)
                if batch.rejected:
                    self.outputs.dead_letter(batch.rejected, now_ms())
                    self.dead_lettered += len(batch.rejected)
                    self.metrics.dead_lettered.inc(len(batch.rejected))
                if len(batch.columns):
                    self._train(batch.columns)
                if batch.offsets or not self.source.assigned:  # idle time counts once partitions are ours
                    last_input = time.monotonic()
                if batch.offsets:
                    self.positions.update(batch.offsets)
                    self._dirty = True
                self._update_gauges()
                if self._snapshot_due():
                    self.checkpoint()
                if idle_exit_s is not None and time.monotonic() - last_input > idle_exit_s:
                    break
        except KeyboardInterrupt:
            log.info("interrupted: writing a final snapshot")
        finally:
            try:
                if self._dirty:
                    self.checkpoint()
                self.finish_publication()
            finally:
                self.source.close()
        return RunSummary(self.learner.samples_trained, self.dead_lettered, self.written, self.promoted,
                          self.resumed_from)

    def _train(self, columns: Columns) -> None:
        began = time.monotonic()
        result = self.learner.step(columns.to_batch(self.cfg.user_buckets, self.cfg.item_buckets))
        took = time.monotonic() - began
        if not result.trained:  # non-finite loss: the batch is not learned from, so it is dead-lettered
            reasons = [(self.source.topic, -1, -1, f"sample {sid}: non-finite training loss", None)
                       for sid in columns.sample_id]
            self.outputs.dead_letter(reasons, now_ms())
            self.dead_lettered += len(reasons)
            self.metrics.dead_lettered.inc(len(reasons))
            return
        self.metrics.batch_latency.observe(took)
        self.metrics.samples.inc(len(columns))
        self.metrics.samples_per_s.set(len(columns) / max(took, 1e-9))
        newest = int(columns.event_time_ms.max())
        self.newest_event_ms = max(self.newest_event_ms or newest, newest)
        self._since_snapshot += len(columns)

    def _snapshot_due(self) -> bool:
        if not self._dirty:
            return False
        return (self._since_snapshot >= self.cfg.snapshot_every_samples
                or time.monotonic() - self._last_snapshot_at >= self.cfg.snapshot_every_s)

    def _update_gauges(self) -> None:
        auc, loss = self.learner.prequential.auc(), self.learner.prequential.logloss()
        if auc is not None:
            self.metrics.auc.set(auc)
        if loss is not None:
            self.metrics.logloss.set(loss)
        if time.monotonic() - self._lag_at >= 1.0:
            self._lag_at = time.monotonic()
            with contextlib.suppress(Exception):  # lag is best-effort telemetry; never stop training for it
                self.metrics.lag.set(self.source.lag())

    def checkpoint(self) -> Manifest | None:
        """Starts publishing a snapshot; the slow part runs beside training. The order, which makes a
        crash at any point safe:

        1. weights must be finite, else nothing is written and training goes back to the last
           snapshot (a NaN never reaches a snapshot);
        2. the promotion gate is decided; when promoted, EWC consolidates on these weights; the state
           is copied (training goes on while it is written);
        3. in the background: snapshot files, then manifest, written and renamed atomically, so it is
           durable before anything names it (the offsets inside make it the restart point); then the
           ModelSnapshot record to the snapshots topic, producer flushed; then, when promoted, the
           Redis current pointer;
        4. back in the training loop, once 3 is done: consumer offsets committed to Kafka (for lag
           tools only) and old snapshots pruned (the last K and the current one stay).
        One publication runs at a time: the next checkpoint first waits for the previous one.
        """
        self.finish_publication()
        self._since_snapshot = 0
        self._dirty = False
        self._last_snapshot_at = time.monotonic()
        if not self.learner.weights_are_finite():
            log.error("non-finite weights: not publishing; reverting to snapshot v%s", self.version)
            self._revert()
            return None
        self._reverts = 0
        current = self.registry.current_version()
        current_auc = self.store.manifest(current).metrics.get("auc") if current in self.store.versions() else None
        auc, loss = self.learner.prequential.auc(), self.learner.prequential.logloss()
        promoted = should_promote(auc, current_auc, self.cfg.promotion_margin)
        if promoted:
            self.learner.consolidate()
        manifest = Manifest(
            version=self.version + 1, parent=self.version or None, created_at=now_ms(),
            model_name=self.learner.model_name, model_config=self.learner.config, feature_set=FEATURE_SET,
            offsets=[{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(self.positions.items())],
            samples_seen=self.learner.samples_trained, sample_digest=f"{self.learner.sample_digest:016x}",
            dead_lettered=self.dead_lettered,
            metrics={"auc": auc, "logloss": loss, "user_collision_rate": self.learner.collisions["user"].rate(),
                     "item_collision_rate": self.learner.collisions["item"].rate()},
            newest_event_ms=self.newest_event_ms, promoted=promoted,
        )
        arrays = {k: v.copy() for k, v in self.learner.state_arrays().items()}
        self.version = manifest.version
        self._publishing = (manifest, dict(self.positions))
        self._publisher = threading.Thread(target=self._publish, args=(manifest, arrays), name="snapshot-publisher")
        self._publisher.start()
        return manifest

    def _publish(self, manifest: Manifest, arrays: dict[str, np.ndarray]) -> None:
        try:
            self.store.write(manifest, arrays)
            self.outputs.announce({
                "version": manifest.version, "parent": manifest.parent, "created_at": manifest.created_at,
                "uri": str(self.store.path(manifest.version)),
                "manifest_sha256": self.store.manifest_sha256(manifest.version), "model_name": manifest.model_name,
                "samples_seen": manifest.samples_seen, "offsets": manifest.offsets, "auc": manifest.metrics["auc"],
                "logloss": manifest.metrics["logloss"], "promoted": manifest.promoted})
            if manifest.promoted:
                self.registry.set_current(manifest.version)
        except BaseException as exc:  # re-raised in the training loop by finish_publication
            self._publish_error = exc

    def finish_publication(self) -> None:
        """Waits for the snapshot being published, then commits offsets and prunes (step 4)."""
        if self._publisher is None:
            return
        self._publisher.join()
        self._publisher = None
        manifest, positions = self._publishing  # type: ignore[misc]
        if self._publish_error is not None:
            error, self._publish_error = self._publish_error, None
            raise RuntimeError(f"publishing snapshot v{manifest.version} failed: {error}") from error
        self.written.append(manifest.version)
        if manifest.promoted:
            self.promoted.append(manifest.version)
            self.metrics.current.set(manifest.version)
        self.source.commit(positions)
        self.store.prune(self.cfg.keep_last, {self.registry.current_version() or manifest.version})
        self.metrics.version.set(manifest.version)
        for table, counter in self.learner.collisions.items():
            self.metrics.collision_rate.labels(table=table).set(counter.rate())
        if manifest.newest_event_ms is not None:
            self.metrics.freshness.set((manifest.created_at - manifest.newest_event_ms) / 1000.0)
        log.info("snapshot v%d: %d samples, auc %s, promoted %s", manifest.version, manifest.samples_seen,
                 manifest.metrics["auc"], manifest.promoted)

    def _revert(self) -> None:
        """Back to the last snapshot's weights and offsets; its samples after it are consumed again."""
        self._reverts += 1
        if self.version == 0 or self._reverts > 2:
            raise RuntimeError("the model's weights became non-finite and reverting did not help; no snapshot was "
                               f"published after v{self.version}. Lower trainer.lr and restart.")
        manifest, arrays = self.store.load(self.version)
        self.learner.load_state_arrays(arrays)
        self.learner.samples_trained = manifest.samples_seen
        self.learner.sample_digest = int(manifest.sample_digest, 16)
        self.dead_lettered = manifest.dead_lettered
        self.positions = manifest.offsets_by_partition()
        self.source.seek(self.positions)


def train(settings: Settings, max_samples: int | None = None, idle_exit_s: float | None = None) -> RunSummary:
    return TrainerService(settings).run(max_samples=max_samples, idle_exit_s=idle_exit_s)
