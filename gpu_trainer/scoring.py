"""Scoring with the current snapshot: verified weights, features from the online store."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from feature_store.base import FeatureReader
from gpu_trainer.batch import Columns, bucket, history_inputs, history_matrix
from gpu_trainer.model_registry import ModelRegistry
from gpu_trainer.models import build_model
from gpu_trainer.snapshots import Manifest, SnapshotError, SnapshotStore
from schemas.feature_set import FEATURE_NAMES, names_for


@dataclass(frozen=True)
class Recent:
    """A user's recent engagements as the samples carry them: items newest first, and each one's event
    type and age (ms) where known (left empty: not known, which a din model reads as such)."""

    items: Sequence[str] = ()
    types: Sequence[str] = ()
    ages_ms: Sequence[int] = ()


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

    @property
    def reads_types_and_ages(self) -> bool:
        """Whether the model reads the recent items' event types and ages too (the din model)."""
        return "type_buckets" in self.manifest.model_config

    def history_inputs(self, recent: Recent, rows: int) -> tuple[torch.Tensor | None, ...]:
        """The recent engagements as the model's history inputs (items, types, ages), the same for `rows`
        rows; Nones for a model that reads none."""
        if not self.history_length:
            return None, None, None

        def given(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray] | None:
            return (np.asarray(values, dtype=object), np.array([len(values)])) if len(values) else None

        history = history_matrix((np.asarray(recent.items, dtype=object), np.array([len(recent.items)])),
                                 self.history_length, given(recent.types), given(recent.ages_ms))
        return tuple(np.repeat(t, rows, axis=0) for t in history_inputs(history, self.item_buckets))

    @torch.no_grad()
    def score_arrays(self, user_ids: Sequence[str], item_ids: Sequence[str], dense: np.ndarray,
                     recent: Recent = Recent()) -> np.ndarray:
        """Click probabilities for aligned (user, item, dense features) rows; `recent`: the user's
        recent engagements, for a model that reads them (as the samples carry them)."""
        self.model.eval()
        logits = self.model(torch.from_numpy(bucket(user_ids, self.user_buckets)),
                            torch.from_numpy(bucket(item_ids, self.item_buckets)),
                            torch.from_numpy(np.asarray(dense, dtype=np.float32)),
                            *self.history_inputs(recent, len(item_ids)))
        return torch.sigmoid(logits).numpy()

    @torch.no_grad()
    def score_samples(self, samples: Sequence[dict]) -> np.ndarray:
        """Click probabilities of TrainingSample records, each with its own recent items."""
        self.model.eval()
        width = int(self.manifest.model_config["n_dense"])
        batch = Columns.from_records(samples, width=width, history_length=self.history_length).to_batch(
            self.user_buckets, self.item_buckets)
        logits = self.model(*batch.model_inputs())
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


def served_recent(loaded: LoadedModel, reader: FeatureReader, user_id: str, lookback_s: int,
                  now_ms: int | None = None) -> Recent:
    """The user's recent engagements from the online store, cut as the samples' are (strictly before
    now, within the lookback, at most what the model reads); none for a model that reads none."""
    if not loaded.history_length:
        return Recent()
    listed = reader.get_recent_engagements([user_id])[0]
    if listed is None:
        return Recent()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return Recent(*listed.before(now, loaded.history_length, lookback_s * 1000))


def score(loaded: LoadedModel, reader: FeatureReader, user_id: str, item_ids: Sequence[str],
          recent: Recent | None = None, lookback_s: int = 3600) -> list[float]:
    """`recent` None: the user's as the online store serves them (`served_recent`)."""
    dense = feature_matrix(reader, user_id, item_ids)
    if recent is None:
        recent = served_recent(loaded, reader, user_id, lookback_s)
    return loaded.score_arrays([user_id] * len(item_ids), list(item_ids), dense, recent).tolist()
