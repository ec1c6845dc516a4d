"""The current-model pointer in Redis beside the snapshots on disk (real Redis)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.settings import Settings
from gpu_trainer.model_registry import ModelRegistry, model_pointer_key
from gpu_trainer.snapshots import WEIGHTS, SnapshotError
from tests.gpu_trainer.test_snapshots import manifest

pytestmark = pytest.mark.integration


def test_pointer_rollback_and_listing(settings: Settings, tmp_path: Path) -> None:
    trainer = settings.trainer.model_copy(update={"snapshot_dir": tmp_path})
    registry = ModelRegistry.from_settings(trainer, settings.redis)
    for v in (1, 2, 3):
        registry.store.write(manifest(v), {"w": np.zeros(2)})
    assert registry.current_version() is None
    registry.set_current(3)
    assert registry.client.get(model_pointer_key(settings.redis.key_prefix)) == b"3"

    assert registry.rollback(1) == 3 and registry.current_version() == 1
    assert [(r.version, r.current) for r in registry.rows()] == [(1, True), (2, False), (3, False)]

    (registry.store.path(2) / WEIGHTS).write_bytes(b"broken")
    with pytest.raises(SnapshotError):
        registry.rollback(2)
    with pytest.raises(SnapshotError, match="no snapshot v9"):
        registry.rollback(9)
    assert registry.current_version() == 1  # a refused rollback changes nothing
