"""Scoring with the current snapshot: verified weights, features from the online store."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from feature_store.base import FeatureReader
from gpu_trainer.batch import Columns, bucket, history_buckets, history_matrix
from gpu_trainer.model_registry import ModelRegistry
from gpu_trainer.models import build_model
from gpu_trainer.snapshots import Manifest, SnapshotError, SnapshotStore
from schemas.feature_set import FEATURE_NAMES, names_for


@dataclass
class LoadedModel:
    manifest: Manifest
    model: nn.Module

    @property
    def user_buckets(self) -> int:
        return int(self.manifest.model_config["user_buckets"])

    @property
    def item_buckets(self) -> int:
        return int(self.manifest.model_config["item_buckets"])

    @property
    def history_length(self) -> int:
        """How many recent items the model reads (0: it reads none)."""
        return int(self.manifest.model_config.get("history_length", 0))

    def history_idx(self, recent_items: Sequence[str], rows: int) -> torch.Tensor | None:
        """The recent items (newest first) as the model's history input, the same for `rows` rows."""
        if not self.history_length:
            return None
        hashes, count = history_matrix(np.asarray(recent_items, dtype=object), np.array([len(recent_items)]),
                                       self.history_length)
        return torch.from_numpy(np.repeat(history_buckets(hashes, count, self.item_buckets), rows, axis=0))

    @torch.no_grad()
    def score_arrays(self, user_ids: Sequence[str], item_ids: Sequence[str], dense: np.ndarray,
                     recent_items: Sequence[str] = ()) -> np.ndarray:
        """Click probabilities for aligned (user, item, dense features) rows; `recent_items`: the user's
        newest engaged items, newest first, for a model that reads them (as the samples carry them)."""
        self.model.eval()
        logits = self.model(torch.from_numpy(bucket(user_ids, self.user_buckets)),
                            torch.from_numpy(bucket(item_ids, self.item_buckets)),
                            torch.from_numpy(np.asarray(dense, dtype=np.float32)),
                            self.history_idx(recent_items, len(item_ids)))
        return torch.sigmoid(logits).numpy()

    @torch.no_grad()
    def score_samples(self, samples: Sequence[dict]) -> np.ndarray:
        """Click probabilities of TrainingSample records, each with its own recent items."""
        self.model.eval()
        width = int(self.manifest.model_config["n_dense"])
        batch = Columns.from_records(samples, width=width, history_length=self.history_length).to_batch(
            self.user_buckets, self.item_buckets)
        logits = self.model(batch.user_idx, batch.item_idx, batch.dense, batch.history_idx)
        return torch.sigmoid(logits).numpy()


def load_snapshot(store: SnapshotStore, version: int) -> LoadedModel:
    """The published (EMA) weights of one snapshot, after its sha256 check."""
    manifest, arrays = store.load(version)
    model = build_model(manifest.model_name, manifest.model_config)
    state = {name[len("published/"):]: torch.from_numpy(a) for name, a in arrays.items()
             if name.startswith("published/")}
    model.load_state_dict(state)
    return LoadedModel(manifest, model)


def load_current(registry: ModelRegistry) -> LoadedModel:
    version = registry.current_version()
    if version is None:
        raise SnapshotError("no current model: the trainer has not promoted a snapshot yet")
    return load_snapshot(registry.store, version)


def feature_matrix(reader: FeatureReader, user_id: str, item_ids: Sequence[str]) -> np.ndarray:
    """Rows in FEATURE_NAMES order: the user's features repeated, then each item's; unknown -> 0."""
    user = reader.get_online_features("user", [user_id], names_for("user"))
    items = reader.get_online_features("item", list(item_ids), names_for("item"))
    user_rows = np.broadcast_to(np.nan_to_num(user.values[:1], nan=0.0), (len(item_ids), user.values.shape[1]))
    matrix = np.hstack([user_rows, np.nan_to_num(items.values, nan=0.0)]).astype(np.float32)
    return matrix.reshape(len(item_ids), len(FEATURE_NAMES))


def served_recent_items(loaded: LoadedModel, reader: FeatureReader, user_id: str, lookback_s: int,
                        now_ms: int | None = None) -> list[str]:
    """The user's recent items from the online store, cut as the samples' are (strictly before now,
    within the lookback, at most what the model reads); none for a model that reads none."""
    if not loaded.history_length:
        return []
    listed = reader.get_recent_engagements([user_id])[0]
    if listed is None:
        return []
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return listed.before(now, loaded.history_length, lookback_s * 1000)[0]


def score(loaded: LoadedModel, reader: FeatureReader, user_id: str, item_ids: Sequence[str],
          recent_items: Sequence[str] | None = None, lookback_s: int = 3600) -> list[float]:
    """`recent_items` None: the user's as the online store serves them (`served_recent_items`)."""
    dense = feature_matrix(reader, user_id, item_ids)
    if recent_items is None:
        recent_items = served_recent_items(loaded, reader, user_id, lookback_s)
    return loaded.score_arrays([user_id] * len(item_ids), list(item_ids), dense, recent_items).tolist()
