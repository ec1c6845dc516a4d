"""Publishing snapshots beside training, and the one way back from a snapshot into a learner.

A publication runs in a background thread while training goes on, in the order that makes a crash
at any point safe:

1. (caller) weights are finite, the promotion gate decided, the state copied;
2. snapshot files, then the manifest, written and renamed atomically, so the snapshot is durable
   before anything names it (the offsets inside make it the restart point);
3. the ModelSnapshot record to the snapshots topic, producer flushed;
4. when promoted, the current-model pointer;
5. (`finish`, back on the training thread, the first round after step 4 or at the next snapshot)
   consumer offsets committed (for lag tools only) and old snapshots pruned (the last K and the current one stay).

One publication runs at a time: `finish` the previous one before the next `begin`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from gpu_trainer.base import ModelPointer, TrainerOutputs
from gpu_trainer.learner import Learner
from gpu_trainer.shadow import ShadowLearners
from gpu_trainer.snapshots import WEIGHTS, Manifest, SnapshotError, SnapshotStore


class ModelMismatchError(RuntimeError):
    """The snapshots hold another model than the settings describe: a configuration error, not damage."""

log = logging.getLogger("rtrec.trainer")


def restore(store: SnapshotStore, version: int, learner: Learner | ShadowLearners) -> Manifest:
    """Loads snapshot `version` (sha256-checked) into `learner`: weights, EMA, EWC state and the
    counters. Resuming at start and reverting after non-finite weights both come through here.
    SnapshotError: the snapshot is damaged (the learner may be partly loaded); ModelMismatchError: it
    holds another model."""
    manifest, arrays = store.load(version)
    if manifest.model_name != learner.model_name or manifest.model_config != learner.config:
        raise ModelMismatchError(f"snapshot v{version} holds {manifest.model_name} {manifest.model_config}; the "
                                 f"trainer is configured for {learner.model_name} {learner.config}. Point "
                                 "trainer.snapshot_dir elsewhere or match the model settings.")
    try:
        learner.load_state_arrays(arrays)
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:  # missing arrays, wrong shapes or dtypes
        raise SnapshotError(f"snapshot v{version}: {WEIGHTS} does not fit the model ({exc!r})") from exc
    learner.samples_trained = manifest.samples_seen
    learner.sample_digest = int(manifest.sample_digest, 16)
    return manifest


def announcement(store: SnapshotStore, manifest: Manifest) -> dict[str, object]:
    """The ModelSnapshot record for a written snapshot."""
    return {"version": manifest.version, "parent": manifest.parent, "created_at": manifest.created_at,
            "uri": str(store.path(manifest.version)), "manifest_sha256": store.manifest_sha256(manifest.version),
            "model_name": manifest.model_name, "samples_seen": manifest.samples_seen, "offsets": manifest.offsets,
            "auc": manifest.metrics["auc"], "logloss": manifest.metrics["logloss"], "promoted": manifest.promoted}


class SnapshotPublisher:
    def __init__(self, store: SnapshotStore, pointer: ModelPointer, outputs: TrainerOutputs, keep_last: int,
                 commit: Callable[[Manifest], None]) -> None:
        self.store = store
        self.pointer = pointer
        self.outputs = outputs
        self.keep_last = keep_last
        self._commit = commit
        self._thread: threading.Thread | None = None
        self._manifest: Manifest | None = None
        self._error: BaseException | None = None
        self._not_written: OSError | None = None
        self.failures = 0  # snapshots that could not be written (a full disk, say); training went on

    def current_auc(self) -> float | None:
        """The gate's reference: the AUC recorded in the current snapshot's manifest; None without a
        current snapshot or when it is damaged (nothing can serve it: an intact one may replace it)."""
        current = self.pointer.current_version()
        if current not in self.store.versions():
            return None
        try:
            return self.store.manifest(current).metrics.get("auc")
        except SnapshotError as exc:
            log.warning("the current snapshot v%d is damaged (%s): the next snapshot is promoted", current, exc)
            return None

    def begin(self, manifest: Manifest, arrays: dict[str, np.ndarray]) -> None:
        """Starts publishing (steps 2-4 in the background); the previous one must be finished first."""
        if self._thread is not None:
            raise RuntimeError(f"snapshot v{manifest.version}: a publication is under way; finish() it first")
        self._manifest = manifest
        self._thread = threading.Thread(target=self._publish, args=(manifest, arrays), name="snapshot-publisher")
        self._thread.start()

    def _publish(self, manifest: Manifest, arrays: dict[str, np.ndarray]) -> None:
        try:
            self.store.write(manifest, arrays)
        except OSError as exc:  # nothing names it yet: training goes on, the next checkpoint tries again
            self._not_written = exc
            return
        except BaseException as exc:
            self._error = exc
            return
        try:
            self.outputs.announce(announcement(self.store, manifest))
            if manifest.promoted:
                self.pointer.set_current(manifest.version)
        except BaseException as exc:  # re-raised on the training thread by finish()
            self._error = exc

    @property
    def writing(self) -> bool:
        """Whether a publication's background steps are still running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def ready_to_finish(self) -> bool:
        """Whether a publication is under way and its background steps are done: `finish` would not wait."""
        return self._thread is not None and not self._thread.is_alive()

    def finish(self) -> Manifest | None:
        """Waits for the publication under way, then commits offsets and prunes (step 5); returns its
        manifest, None when none was under way or its files could not be written (logged, counted in
        `failures`; the caller's next checkpoint tries again). Any other failure raises here."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        manifest, self._manifest = self._manifest, None
        assert manifest is not None
        if self._not_written is not None:
            error, self._not_written = self._not_written, None
            self.failures += 1
            log.error("snapshot v%d was not written to %s: %s; nothing names it, training goes on and the next "
                      "snapshot tries again", manifest.version, self.store.root, error.strerror or error)
            return None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"publishing snapshot v{manifest.version} failed: {error}") from error
        self._commit(manifest)
        self.store.prune(self.keep_last, {self.pointer.current_version() or manifest.version})
        return manifest
