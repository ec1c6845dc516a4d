"""Ways a snapshot on disk gets damaged, each applied to one version, for the fallback tests."""

from __future__ import annotations

import json

import numpy as np

from gpu_trainer.snapshots import MANIFEST, WEIGHTS, SnapshotStore, sha256_file


def _reseal(store: SnapshotStore, version: int) -> None:
    """Makes the manifest's sha256 match the (damaged) weights, so only the content check can refuse them."""
    path = store.path(version) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["files"][WEIGHTS] = sha256_file(store.path(version) / WEIGHTS)
    path.write_text(json.dumps(manifest))


def changed_bytes(store: SnapshotStore, version: int) -> None:
    weights = store.path(version) / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))


def pickled_objects(store: SnapshotStore, version: int) -> None:
    np.savez(store.path(version) / WEIGHTS, payload=np.array([{"code": "would run"}], dtype=object))
    _reseal(store, version)


def truncated_archive(store: SnapshotStore, version: int) -> None:
    weights = store.path(version) / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])
    _reseal(store, version)


def missing_weights(store: SnapshotStore, version: int) -> None:
    (store.path(version) / WEIGHTS).unlink()


def garbage_manifest(store: SnapshotStore, version: int) -> None:
    (store.path(version) / MANIFEST).write_text("{not json")


DAMAGE = {"changed bytes": (changed_bytes, "has sha256"),
          "pickled objects": (pickled_objects, "holds pickled Python objects"),
          "truncated archive": (truncated_archive, "is not a numpy archive"),
          "missing weights": (missing_weights, "weights.npz is missing"),
          "garbage manifest": (garbage_manifest, "manifest.json is unreadable")}
