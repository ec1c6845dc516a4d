"""Snapshots on disk: atomic writes, sha256-checked loads, retention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_trainer.snapshots import WEIGHTS, Manifest, SnapshotError, SnapshotStore


def manifest(version: int) -> Manifest:
    return Manifest(version=version, parent=version - 1 or None, created_at=0, model_name="mf", model_config={},
                    feature_set="v1", offsets=[{"topic": "t", "partition": 0, "offset": 10 * version}],
                    samples_seen=100 * version, sample_digest="0" * 16, dead_lettered=0, metrics={"auc": 0.7},
                    newest_event_ms=None, promoted=True)


def test_write_then_load_gives_back_the_arrays_and_offsets(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    store.write(manifest(1), {"trained/w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    loaded, arrays = store.load(1)
    assert loaded.offsets_by_partition() == {("t", 0): 10} and loaded.files[WEIGHTS]
    np.testing.assert_array_equal(arrays["trained/w"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert [p.name for p in tmp_path.iterdir()] == ["v000001"]  # no temporary directory left


def test_a_changed_weights_file_is_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    store.write(manifest(1), {"w": np.zeros(3)})
    (store.path(1) / WEIGHTS).write_bytes(b"not the weights")
    with pytest.raises(SnapshotError, match="has sha256"):
        store.load(1)


def test_versions_are_never_overwritten_and_prune_keeps_the_current(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for v in range(1, 6):
        store.write(manifest(v), {"w": np.zeros(1)})
    with pytest.raises(SnapshotError, match="already exists"):
        store.write(manifest(3), {"w": np.zeros(1)})
    assert store.prune(keep_last=2, keep={1}) == [2, 3]
    assert store.versions() == [1, 4, 5] and store.latest_version() == 5
