"""The trainer service: poll micro-batches, check them, `Learner.step` each, publish snapshots.

At start it restores the newest snapshot (weights, EMA, EWC state, sample count) and consumes from
that snapshot's offsets, so after a crash (even `kill -9`) every sample is trained exactly once in
the lineage of the snapshot the model continues from.

Its I/O comes in through `gpu_trainer.base`'s Protocols: `from_settings` wires Kafka and Redis,
tests wire in-memory fakes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from core.settings import Settings, TrainerSettings
from gpu_trainer.base import ModelPointer, Positions, SampleSource, TrainerOutputs
from gpu_trainer.batch import Batch, Columns
from gpu_trainer.device import pick_device
from gpu_trainer.distributed import Agreed, GradientExchange, Ranks, Round, combine
from gpu_trainer.exchange import StepExchange
from gpu_trainer.learner import Learner
from gpu_trainer.publisher import SnapshotPublisher, restore
from gpu_trainer.shadow import ShadowLearners
from gpu_trainer.snapshots import Manifest, SnapshotError, SnapshotStore, now_ms, should_promote
from gpu_trainer.telemetry import TrainerMetrics
from gpu_trainer.validation import check_samples, sample_key
from schemas.dead_letter import Reject
from schemas.feature_set import FEATURE_NAMES, FEATURE_SET

log = logging.getLogger("rtrec.trainer")


@dataclass
class RunSummary:
    samples_trained: int
    dead_lettered: int
    snapshots: list[int]
    promoted: list[int]
    resumed_from: int | None


def make_learner(cfg: TrainerSettings, n_features: int,
                 exchange: StepExchange | None = None) -> Learner | ShadowLearners:
    """The configured update rule, or the shadow learners of `trainer.shadow_variants`."""
    if cfg.shadow_variants:
        return ShadowLearners(cfg, n_features, exchange)
    return Learner(cfg, n_features, exchange=exchange)


def copied(arrays: dict[str, np.ndarray], reuse: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A copy of each array for the publisher thread while training goes on; names viewing the same
    memory (with shadow learners, the leader's arrays and its variant's) share one copy. A buffer in
    `reuse` under the same name, shape and dtype takes the copy instead of a new one: the caller's
    copies from a snapshot whose publication has finished. Fresh memory costs a page fault per 4 KB:
    copying the default model's 66 MB took 45-180 ms into fresh memory and 9 ms into the last copy.

    >>> a = np.zeros(3)
    >>> out = copied({"x": a, "y": a, "z": a[:2]})
    >>> out["x"] is out["y"], out["x"] is a, out["z"].shape
    (True, False, (2,))
    >>> again = copied({"x": a + 1, "y": a[:2]}, reuse=out)
    >>> again["x"] is out["x"], again["x"].tolist(), again["y"] is out["y"]
    (True, [1.0, 1.0, 1.0], False)
    """
    reuse = reuse or {}
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...], str], np.ndarray] = {}
    taken: set[int] = set()  # the reused buffers already holding a copy in this call
    out = {}
    for name, array in arrays.items():
        key = (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)
        if key not in seen:
            kept = reuse.get(name)
            if kept is not None and kept.shape == array.shape and kept.dtype == array.dtype and id(kept) not in taken:
                np.copyto(kept, array)
                taken.add(id(kept))
                seen[key] = kept
            else:
                seen[key] = _unadvised_empty(array)
                np.copyto(seen[key], array)
        out[name] = seen[key]
    return out


def _unadvised_empty(like: np.ndarray) -> np.ndarray:
    """An uninitialised array like `like` from torch's allocator. numpy asks the kernel for transparent
    huge pages for large arrays (madvise), and where the kernel then compacts memory to find them
    (transparent_hugepage/defrag = madvise, a common default) the first copy of the state stalled the
    training thread for 0.5-0.9 s instead of 45 ms (here, 66 MB)."""
    return torch.empty(like.nbytes, dtype=torch.uint8).numpy().view(like.dtype).reshape(like.shape)


class RanksChanged(RuntimeError):
    """Other ranks stopped (their torchrun agents were stopped: a scale-down) while this one was not
    asked to: the snapshot of the round they stopped in is written, and this rank ends non-zero so that
    its agent restarts it in the smaller membership, from that snapshot."""


class TrainerService:
    def __init__(self, cfg: TrainerSettings, source: SampleSource, outputs: TrainerOutputs, pointer: ModelPointer,
                 store: SnapshotStore, n_features: int = len(FEATURE_NAMES), metrics: TrainerMetrics | None = None,
                 learner: Learner | ShadowLearners | None = None, metrics_host: str = "127.0.0.1",
                 ranks: Ranks | None = None) -> None:
        self.cfg = cfg
        self.ranks = ranks  # torchrun's ranks (gpu_trainer.distributed); None: one process
        self.leads = ranks is None or ranks.leader  # writes the snapshots, serves the metrics
        self.metrics_host = metrics_host
        self.source = source
        self.outputs = outputs
        self.pointer = pointer
        self.store = store
        self.n_features = n_features
        # ranks exchanging gradients each step on their own samples; else on every rank's (or alone)
        self.exchange = GradientExchange() if ranks is not None and cfg.rank_exchange == "gradients" else None
        self.learner = learner or make_learner(cfg, n_features, self.exchange)
        self.metrics = metrics or TrainerMetrics()
        self.publisher = SnapshotPublisher(store, pointer, outputs, cfg.keep_last, self._published)
        self.version = 0
        self.dead_lettered = 0
        self.positions: Positions = {}
        self.newest_event_ms: int | None = None
        self.resumed_from: int | None = None
        self._resumed = False
        self._already_dead_lettered: set[bytes] = set()
        self._since_snapshot = 0
        self._dirty = False
        self._reverts = 0
        # the last snapshot's copy of the state, refilled by the next once its publication has finished
        self._snapshot_copy: dict[str, np.ndarray] = {}
        self._gauges_at = 0.0
        self._last_snapshot_at = time.monotonic()
        self.written: list[int] = []
        self.promoted: list[int] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> TrainerService:
        """Kafka source and outputs, the Redis model pointer, the snapshot directory of `settings`."""
        from gpu_trainer.kafka_adapters import KafkaSampleSource, KafkaTrainerOutputs
        from gpu_trainer.model_registry import ModelRegistry

        registry = ModelRegistry.from_settings(settings.trainer, settings.redis)
        ranks = Ranks.from_env(device=pick_device(settings.trainer.device))
        return cls(settings.trainer, KafkaSampleSource.from_settings(settings.kafka, settings.trainer, ranks),
                   KafkaTrainerOutputs.from_settings(settings.kafka).open(), registry, registry.store,
                   metrics_host=settings.services.metrics_host, ranks=ranks)

    def _restore(self, version: int) -> Manifest:
        manifest = restore(self.store, version, self.learner)
        if isinstance(self.learner, ShadowLearners) and manifest.variant in self.learner.variants:
            self.learner.gate.leader = manifest.variant
        self.dead_lettered = manifest.dead_lettered
        self.positions = manifest.offsets_by_partition()
        self.version = version
        self.newest_event_ms = manifest.newest_event_ms
        return manifest

    def resume(self) -> int | None:
        """Restores the newest intact snapshot, if any (a damaged one is skipped, with the reason
        logged); the source starts at its offsets. Also sweeps what interrupted writes left behind
        and learns which dead letters the samples after the snapshot already got, so that reading
        them again writes none twice. `run` calls it unless it was called already."""
        self._resumed = True
        for debris in self.store.sweep_temporary() if self.leads else []:
            log.warning("removed %s, left by an interrupted snapshot write", debris)
        skipped: list[str] = []
        manifest = None
        for version in reversed(self.store.versions()):
            try:
                manifest = self._restore(version)
                break
            except SnapshotError as exc:
                log.error("cannot resume from snapshot v%d: %s", version, exc)
                skipped.append(f"v{version}: {exc}")
        if skipped:
            if manifest is None:  # the learner may hold part of a damaged snapshot: start it anew
                self.learner = make_learner(self.cfg, self.n_features, self.exchange)
            log.warning("%s; skipped: %s", f"resumed from v{self.version}, the newest intact snapshot"
                        if manifest else "no intact snapshot: training starts from scratch", "; ".join(skipped))
        if manifest is not None:
            log.info("resumed from snapshot v%d: %d samples, offsets %s", self.version, manifest.samples_seen,
                     self.positions)
        self.resumed_from = self.version if manifest is not None else None
        since_ms = manifest.created_at - 60_000 if manifest is not None else 0
        self._already_dead_lettered = self.outputs.dead_lettered_since(since_ms)
        return self.resumed_from

    def run(self, max_samples: int | None = None, idle_exit_s: float | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> RunSummary:
        """Trains until `should_stop()`, `max_samples` trained in total, or `idle_exit_s` without input."""
        if not self._resumed:
            self.resume()
        self.source.start(self.positions)
        log.info("consuming %s from %s", self.source.topic, self.positions or "the beginning")
        if self.cfg.metrics_port and self.leads:
            self.metrics.serve(self.cfg.metrics_port, self.metrics_host)
        # the ranks' polls together make one micro-batch of the configured size
        per_poll = math.ceil(self.cfg.batch_size / (self.ranks.world if self.ranks else 1))
        last_input = time.monotonic()
        hurry = False  # ranks: another rank had a backlog in the last round and this one had none (see _poll)
        others_stopped = False
        try:
            while True:
                stop = should_stop() or (max_samples is not None and self.learner.samples_trained >= max_samples)
                mine, own = self._poll(per_poll, stop, last_input, hurry)
                if mine.idle_s == 0.0:
                    last_input = time.monotonic()
                agreed = self._agree(mine)
                hurry = agreed.behind and not mine.behind
                self._count_dead_letters(agreed.dead_lettered)
                if agreed.rows:  # every rank steps, on every rank's samples or (exchanging gradients) its own
                    self._train(mine.batch if self.exchange is not None else agreed.batch, agreed, own)
                if agreed.offsets:
                    self.positions.update(agreed.offsets)
                    self._dirty = True
                self._update_gauges()
                if self._snapshot_due(agreed):
                    self.checkpoint()
                elif self.publisher.ready_to_finish:  # commit now, not at the next snapshot: idle may be long
                    self._finish_publication()
                if agreed.stop or (idle_exit_s is not None and agreed.idle_s > idle_exit_s):
                    others_stopped = agreed.stop and not mine.stop
                    break
        except KeyboardInterrupt:
            log.info("interrupted: writing a final snapshot")
        finally:
            try:
                if self._dirty:
                    self.checkpoint()
                self._finish_publication()
            finally:
                self.source.close()
        # A SIGTERM reaches the ranks of one agent a moment apart: one asked to stop in the very round
        # the others stopped in is stopping as well, not left behind by a scale-down.
        if others_stopped and self.ranks is not None and not should_stop():
            raise RanksChanged(f"rank {self.ranks.rank}: other ranks stopped; snapshot v{self.version} holds "
                               "this round, torchrun restarts this rank in the new membership")
        return RunSummary(self.learner.samples_trained, self.dead_lettered, self.written, self.promoted,
                          self.resumed_from)

    def _poll(self, max_records: int, stop: bool, last_input: float, hurry: bool) -> tuple[Round, Columns]:
        """This process's part of a round: what it polled (nothing once it is to stop), checked, its
        rejects dead-lettered; and its good samples as columns."""
        offsets: Positions = {}
        rejected = 0
        if stop:
            good = Columns.from_records([], width=self.n_features, history_length=self.cfg.history_length)
        else:
            # A round waits for its slowest rank. While another rank works through a backlog, one that
            # has caught up takes what has arrived instead of waiting out the batch timeout for more:
            # waiting, it held every round of the others' backlog by that timeout.
            polled = self.source.poll(max_records, 0.0 if hurry else self.cfg.batch_timeout_ms / 1000.0)
            history = self.cfg.history_length
            columns = (Columns.from_decoded(polled.columns, self.n_features, history) if polled.columns is not None
                       else Columns.from_records(polled.records, width=self.n_features, history_length=history))
            ok, rejects = check_samples(columns, self.n_features, FEATURE_SET, self.source.topic,
                                        self.cfg.max_id_length)
            self._write_dead_letters(polled.rejected + rejects)
            good, offsets, rejected = columns.select(ok), polled.offsets, len(polled.rejected) + len(rejects)
        if offsets:
            idle_s = 0.0
        elif not self.source.has_partitions():
            # one process: idle counts once the group gave it partitions; a rank without any (more ranks
            # than partitions) is never the one that keeps the others from idling out
            idle_s = math.inf if self.ranks is not None else 0.0
        else:
            idle_s = time.monotonic() - last_input
        batch = good.to_batch(self.cfg.user_buckets, self.cfg.item_buckets)
        return Round(batch, offsets, rejected, idle_s, stop, self._snapshot_time_due(),
                     behind=not stop and self.ranks is not None and self._has_backlog(),
                     publishing=self.publisher.writing), good

    def _has_backlog(self) -> bool:
        """Whether this rank's partitions hold records it has not polled (from the high watermarks its
        fetches brought: no round trip)."""
        try:
            return self.source.lag() > 0
        except Exception:  # lag is a hint for pacing; not knowing it means waiting as before
            return False

    def _agree(self, mine: Round) -> Agreed:
        if self.ranks is None:
            return combine([mine])
        return self.ranks.exchange(mine.without_samples() if self.exchange is not None else mine)

    def _count_dead_letters(self, n: int) -> None:
        if n:
            self.dead_lettered += n
            self.metrics.dead_lettered.inc(n)

    def _write_dead_letters(self, rejects: list[Reject]) -> None:
        """Writes those not dead-lettered before (a restart reads again what came after its snapshot:
        their dead letters were written already, their count was not kept)."""
        if not rejects:
            return
        keyed = [r if r.key is not None else replace(r, key=f"{r.topic}:{r.partition}:{r.offset}".encode())
                 for r in rejects]
        new = [r for r in keyed if r.key not in self._already_dead_lettered]
        if new:
            self.outputs.dead_letter(new)

    def _train(self, batch: Batch, agreed: Agreed, own: Columns) -> None:
        """Learns from `batch` (all ranks' samples, or this rank's when ranks exchange gradients: then
        `agreed` counts them all); `own`: what this process polled (all of it, but for ranks)."""
        began = time.monotonic()
        switches = len(self.learner.gate.switches) if isinstance(self.learner, ShadowLearners) else 0
        result = self.learner.step(batch)
        took = time.monotonic() - began
        if isinstance(self.learner, ShadowLearners) and len(self.learner.gate.switches) > switches:
            switch = self.learner.gate.switches[-1]
            log.info("shadow learners: publishing %s instead of %s: %s", switch["to"], switch["from"],
                     switch["reason"])
        if not result.trained:  # non-finite loss: the batch is not learned from, so it is dead-lettered
            self._write_dead_letters([Reject(f"sample {sid}: non-finite training loss", self.source.topic,
                                             key=sample_key(str(sid))) for sid in own.sample_id])
            self._count_dead_letters(agreed.rows)
            return
        self.metrics.batch_latency.observe(took)
        self.metrics.samples.inc(agreed.rows)
        self.metrics.samples_per_s.set(agreed.rows / max(took, 1e-9))
        if agreed.newest_ms is not None:
            self.newest_event_ms = max(self.newest_event_ms or agreed.newest_ms, agreed.newest_ms)
        self._since_snapshot += agreed.rows

    def _snapshot_time_due(self) -> bool:
        return time.monotonic() - self._last_snapshot_at >= self.cfg.snapshot_every_s

    def _snapshot_due(self, agreed: Agreed) -> bool:
        """After a round: its sample count is every rank's; the clock and the publication under way that
        count are rank 0's, read as the round began, so all ranks decide alike. A snapshot due while the
        last one is still being written waits for that write, and training goes on (waiting for the
        disk held training for 1.7 of 7.6 s over a backlog, a snapshot every 100,000 samples); the next
        one holds the samples trained meanwhile."""
        return self._dirty and not agreed.publishing and (
            self._since_snapshot >= self.cfg.snapshot_every_samples or agreed.snapshot_due)

    def _update_gauges(self) -> None:
        """Once a second at most: the rolling AUC sorts the whole evaluation window."""
        if time.monotonic() - self._gauges_at < 1.0:
            return
        self._gauges_at = time.monotonic()
        auc, loss = self.learner.published_prequential.auc(), self.learner.published_prequential.logloss()
        if auc is not None:
            self.metrics.auc.set(auc)
        if loss is not None:
            self.metrics.logloss.set(loss)
        if isinstance(self.learner, ShadowLearners):
            for name, value in self.learner.variant_aucs().items():
                if value is not None:
                    self.metrics.variant_auc.labels(variant=name).set(value)
                self.metrics.variant_published.labels(variant=name).set(int(name == self.learner.gate.leader))
        with contextlib.suppress(Exception):  # lag is best-effort telemetry; never stop training for it
            self.metrics.lag.set(self.source.lag())

    def checkpoint(self) -> Manifest | None:
        """Starts publishing a snapshot (see gpu_trainer.publisher for the order). Non-finite weights
        are never published: training goes back to the last snapshot instead. The promotion gate
        compares the prequential AUC of the weights being published (the EMA when it is on) with the
        current snapshot's."""
        self._finish_publication()
        self._since_snapshot = 0
        self._dirty = False
        self._last_snapshot_at = time.monotonic()
        if self.ranks is not None:
            if not self.learner.weights_are_finite():  # each rank ends; torchrun restarts them from the snapshot
                raise RuntimeError(f"the model's weights became non-finite after snapshot v{self.version}")
            if not self.ranks.same_weights(self.learner.state_arrays()):
                raise RuntimeError("the ranks' replicas of the model differ; restarting them from the snapshot")
        elif not self.learner.weights_are_finite():
            log.error("non-finite weights: not publishing; reverting to snapshot v%s", self.version)
            self._revert()
            return None
        self._reverts = 0
        published, trained = self.learner.published_prequential, self.learner.prequential
        auc, loss = published.auc(), published.logloss()
        promoted = should_promote(auc, self.publisher.current_auc(), self.cfg.promotion_margin) if self.leads \
            else False
        if self.ranks is not None:  # promotion consolidates EWC: every replica takes rank 0's decision
            promoted = self.ranks.from_leader(promoted)
        if promoted:
            self.learner.consolidate()
        if not self.leads:
            return None
        manifest = Manifest(
            version=max(self.version, self.store.highest_taken()) + 1, parent=self.version or None,
            created_at=now_ms(),
            model_name=self.learner.model_name, model_config=self.learner.config, feature_set=FEATURE_SET,
            offsets=[{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(self.positions.items())],
            samples_seen=self.learner.samples_trained, sample_digest=f"{self.learner.sample_digest:016x}",
            dead_lettered=self.dead_lettered,
            metrics={"auc": auc, "logloss": loss, "trained_auc": trained.auc(), "trained_logloss": trained.logloss(),
                     "user_collision_rate": self.learner.collisions["user"].rate(),
                     "item_collision_rate": self.learner.collisions["item"].rate(),
                     **({f"variant_auc.{name}": value for name, value in self.learner.variant_aucs().items()}
                        if isinstance(self.learner, ShadowLearners) else {})},
            newest_event_ms=self.newest_event_ms, promoted=promoted,
            variant=self.learner.gate.leader if isinstance(self.learner, ShadowLearners) else None,
        )
        # the publication before is finished (above), so its copy is free to refill
        self._snapshot_copy = copied(self.learner.state_arrays(), reuse=self._snapshot_copy)
        self.publisher.begin(manifest, self._snapshot_copy)
        return manifest

    def _finish_publication(self) -> None:
        failures = self.publisher.failures
        finished = self.publisher.finish()
        if self.publisher.failures > failures:
            # Its samples are in no snapshot yet: the next one (or the final one) takes them. Ranks decide on
            # snapshots alike, from what they agreed; rank 0 alone knows of this failure, so there the next
            # round with samples does (the restart point stays the last snapshot written: nothing is lost).
            if self.ranks is None:
                self._dirty = True
            self.metrics.snapshot_failures.inc()
        self._record(finished)

    def _published(self, manifest: Manifest) -> None:
        """Step 5 of a publication, on the training thread: offsets committed for lag tools."""
        self.source.commit(manifest.offsets_by_partition())

    def _record(self, manifest: Manifest | None) -> None:
        if manifest is None:
            return
        self.version = manifest.version
        self.written.append(manifest.version)
        if manifest.promoted:
            self.promoted.append(manifest.version)
            self.metrics.current.set(manifest.version)
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
        self._restore(self.version)
        self.source.seek(self.positions)
