"""Versioned snapshots on disk, the current-version pointer, promotion and retention.

Layout: `<snapshot_dir>/v000042/` holding `weights.npz` (numpy arrays, loaded with
allow_pickle=False: loading runs no code) and `manifest.json` (version, parent, created_at, the
Kafka offsets consumed, samples seen, metrics, model config, sha256 of each file). A snapshot
directory appears atomically (written under a temporary name, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS = "weights.npz"
MANIFEST = "manifest.json"


class SnapshotError(RuntimeError):
    pass


@dataclass
class Manifest:
    version: int
    parent: int | None
    created_at: int  # epoch ms
    model_name: str
    model_config: dict[str, Any]
    feature_set: str
    offsets: list[dict[str, Any]]  # [{"topic", "partition", "offset"}], offset = next to consume
    samples_seen: int
    sample_digest: str
    dead_lettered: int
    metrics: dict[str, float | None]
    newest_event_ms: int | None
    promoted: bool
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256
    variant: str | None = None  # with shadow learners: the update rule whose weights these are

    def offsets_by_partition(self) -> dict[tuple[str, int], int]:
        return {(o["topic"], int(o["partition"])): int(o["offset"]) for o in self.offsets}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through (saves re-reading the weights)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self._sha = hashlib.sha256()
        self._pos = 0

    def write(self, data: bytes) -> int:
        if self._fh.closed:  # numpy's ZipFile finishing itself after a failed write (a full disk): drop it
            return len(data)
        self._sha.update(data)
        self._pos += len(data)
        return self._fh.write(data)

    def tell(self) -> int:
        return self._pos

    def read(self, *_: Any) -> bytes:  # numpy only checks that it exists
        raise OSError("write-only")

    def seek(self, *_: Any) -> int:
        raise OSError("not seekable")  # zipfile then streams, writing sizes after each member

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        if not self._fh.closed:
            self._fh.flush()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def versions(self) -> list[int]:
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            if p.name.startswith("v") and p.name[1:].isdigit() and (p / MANIFEST).is_file():
                found.append(int(p.name[1:]))
        return sorted(found)

    def latest_version(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None

    def highest_taken(self) -> int:
        """The highest version number any snapshot directory has, intact or not (0 without any): a
        new snapshot takes the next one, never the name of a broken one."""
        if not self.root.is_dir():
            return 0
        return max((int(p.name[1:]) for p in self.root.iterdir() if p.name[:1] == "v" and p.name[1:].isdigit()),
                   default=0)

    def sweep_temporary(self) -> list[Path]:
        """Removes what an interrupted write left behind (`.tmp-v*`); returns what it removed."""
        if not self.root.is_dir():
            return []
        debris = [p for p in self.root.iterdir() if p.name.startswith(".tmp-v")]
        for p in debris:
            shutil.rmtree(p, ignore_errors=True)
        return debris

    def write(self, manifest: Manifest, arrays: dict[str, np.ndarray]) -> Path:
        """Writes weights then manifest under a temporary name, fsyncs, and renames into place."""
        final = self.path(manifest.version)
        if final.exists():
            raise SnapshotError(f"snapshot v{manifest.version} already exists in {self.root}")
        tmp = self.root / f".tmp-v{manifest.version:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            with open(tmp / WEIGHTS, "wb") as fh:
                hashing = _HashingWriter(fh)
                np.savez(hashing, **arrays)
                fh.flush()
                os.fsync(fh.fileno())
            manifest.files = {WEIGHTS: hashing.hexdigest()}
            with open(tmp / MANIFEST, "w") as fh:
                json.dump(asdict(manifest), fh, indent=2, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a half-written snapshot must not keep the disk full
            raise
        return final

    def manifest(self, version: int) -> Manifest:
        path = self.path(version) / MANIFEST
        if not path.is_file():
            raise SnapshotError(f"no snapshot v{version} in {self.root}")
        try:
            return Manifest(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:  # JSON syntax, or fields that are not a manifest's
            raise SnapshotError(f"snapshot v{version}: {MANIFEST} is unreadable ({exc})") from exc

    def manifest_sha256(self, version: int) -> str:
        return sha256_file(self.path(version) / MANIFEST)

    def load(self, version: int) -> tuple[Manifest, dict[str, np.ndarray]]:
        """The manifest and arrays, after checking every file's sha256."""
        manifest = self.manifest(version)
        if WEIGHTS not in manifest.files:
            raise SnapshotError(f"snapshot v{version}: the manifest lists no {WEIGHTS}")
        for name, expected in manifest.files.items():
            path = self.path(version) / name
            if not path.is_file():
                raise SnapshotError(f"snapshot v{version}: {name} is missing")
            actual = sha256_file(path)
            if actual != expected:
                raise SnapshotError(f"snapshot v{version}: {name} has sha256 {actual}, manifest says {expected}")
        try:
            with np.load(self.path(version) / WEIGHTS, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except ValueError as exc:
            if "allow_pickle" in str(exc):
                raise SnapshotError(f"snapshot v{version}: {WEIGHTS} holds pickled Python objects; refused "
                                    "(loading them could run code)") from exc
            raise SnapshotError(f"snapshot v{version}: {WEIGHTS} is not a numpy archive ({exc})") from exc
        except (OSError, EOFError, zipfile.BadZipFile) as exc:
            raise SnapshotError(f"snapshot v{version}: {WEIGHTS} is not a numpy archive ({exc})") from exc
        return manifest, arrays

    def prune(self, keep_last: int, keep: set[int]) -> list[int]:
        """Deletes all but the newest `keep_last` and those in `keep` (the current one)."""
        versions = self.versions()
        doomed = [v for v in versions[:-keep_last] if v not in keep] if keep_last > 0 else []
        for v in doomed:
            shutil.rmtree(self.path(v), ignore_errors=True)
        return doomed


def now_ms() -> int:
    return int(time.time() * 1000)


def should_promote(candidate_auc: float | None, current_auc: float | None, margin: float) -> bool:
    """Metric gate: keep but do not promote a snapshot whose AUC falls more than `margin` below.

    >>> should_promote(0.70, 0.75, 0.02), should_promote(0.74, 0.75, 0.02), should_promote(None, 0.7, 0.02)
    (False, True, False)
    """
    if current_auc is None:
        return True
    if candidate_auc is None:
        return False
    return candidate_auc >= current_auc - margin
