"""A typed micro-batch and its bulk construction from decoded TrainingSample records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from schemas.bulk import BulkDecoded

# Fixed 16-byte key: bucket ids must be the same in every process (training, scoring, ONNX callers).
_HASH_KEY = "rtrec-id-hash-01"


def hash_ids(ids: Sequence[str] | np.ndarray) -> np.ndarray:
    """Stable 64-bit hashes of string ids, vectorised (SipHash via pandas).

    >>> int(hash_ids(["u1"])[0]) == int(hash_ids(np.array(["u1"], dtype=object))[0])
    True
    """
    return pd.util.hash_array(np.asarray(ids, dtype=object), hash_key=_HASH_KEY, categorize=True)


def bucket(ids: Sequence[str] | np.ndarray, n_buckets: int) -> np.ndarray:
    return (hash_ids(ids) % np.uint64(n_buckets)).astype(np.int64)


@dataclass
class Batch:
    user_idx: torch.Tensor  # int64 [B]
    item_idx: torch.Tensor  # int64 [B]
    dense: torch.Tensor  # float32 [B, F]
    label: torch.Tensor  # float32 [B]
    event_time_ms: torch.Tensor  # int64 [B]
    sample_hash: np.ndarray  # uint64 [B], for the trained-set digest
    user_hash: np.ndarray | None = None  # uint64 [B], before bucketing (collision accounting)
    item_hash: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def head(self, rows: int) -> Batch:
        """The first `rows` samples (views, no copies)."""
        if rows >= len(self):
            return self
        return Batch(self.user_idx[:rows], self.item_idx[:rows], self.dense[:rows], self.label[:rows],
                     self.event_time_ms[:rows], self.sample_hash[:rows],
                     None if self.user_hash is None else self.user_hash[:rows],
                     None if self.item_hash is None else self.item_hash[:rows])

    @classmethod
    def concat(cls, parts: Sequence[Batch]) -> Batch:
        """The rows of `parts`, in order (empty parts add nothing)."""
        kept = [p for p in parts if len(p)] or list(parts[:1])

        def hashes(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in kept]
            return None if any(a is None for a in arrays) else np.concatenate(arrays)

        return cls(*(torch.cat([getattr(p, n) for p in kept]) for n in ("user_idx", "item_idx", "dense", "label",
                                                                        "event_time_ms")),
                   sample_hash=np.concatenate([p.sample_hash for p in kept]), user_hash=hashes("user_hash"),
                   item_hash=hashes("item_hash"))

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        if device.type == "cuda":
            move = {k: getattr(self, k).pin_memory().to(device, non_blocking=non_blocking)
                    for k in ("user_idx", "item_idx", "dense", "label")}
        else:
            move = {k: getattr(self, k).to(device) for k in ("user_idx", "item_idx", "dense", "label")}
        return Batch(**move, event_time_ms=self.event_time_ms, sample_hash=self.sample_hash,
                     user_hash=self.user_hash, item_hash=self.item_hash)


_COLUMN_FIELDS = ("sample_id", "user_id", "item_id", "features", "feature_len", "label", "event_time_ms",
                  "feature_set")


@dataclass
class Columns:
    """Column arrays of a set of samples, before hashing into buckets."""

    sample_id: np.ndarray
    user_id: np.ndarray
    item_id: np.ndarray
    features: np.ndarray  # float32 [B, F]; rows shorter than F are zero-padded
    feature_len: np.ndarray  # int64 [B], each record's own feature count
    label: np.ndarray
    event_time_ms: np.ndarray
    feature_set: np.ndarray

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]], width: int | None = None) -> Columns:
        """With `width`, the feature matrix has exactly that many columns whatever the records hold
        (longer rows cut, shorter ones zero-padded; `feature_len` keeps each record's own count, so
        the checks can refuse them): one over-long record never changes the batch's shape."""
        frame = pd.DataFrame.from_records(records, columns=["sample_id", "user_id", "item_id", "features", "label",
                                                            "event_time", "feature_set"])
        lengths = frame["features"].map(len).to_numpy(np.int64)
        if width is None:
            width = int(lengths.max()) if len(lengths) else 0
        if len(frame) and (lengths == width).all():
            features = np.asarray(np.stack(frame["features"].to_numpy()), dtype=np.float32).reshape(len(frame), width)
        else:
            features = np.zeros((len(frame), width), dtype=np.float32)
            for i, row in enumerate(frame["features"]):  # ragged input only; such rows get rejected by length
                kept = min(len(row), width)
                features[i, :kept] = row[:kept]
        return cls(frame["sample_id"].to_numpy(), frame["user_id"].to_numpy(), frame["item_id"].to_numpy(),
                   features, lengths, frame["label"].to_numpy(dtype=np.float32),
                   frame["event_time"].to_numpy(np.int64), frame["feature_set"].to_numpy())

    @classmethod
    def from_decoded(cls, decoded: BulkDecoded, width: int) -> Columns:
        """From TrainingSample columns decoded in bulk; the decoder already cut or padded the feature
        matrix to its width (schemas.bulk), which must be the model's `width`."""
        columns = decoded.columns
        features = columns["features"]
        if features.shape[1] != width:
            raise ValueError(f"samples decoded {features.shape[1]} features wide, the model takes {width}")
        return cls(columns["sample_id"], columns["user_id"], columns["item_id"], features,
                   decoded.lengths["features"], columns["label"].astype(np.float32), columns["event_time"],
                   columns["feature_set"])

    def __len__(self) -> int:
        return len(self.label)

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        """The rows of `parts`, in order (empty parts, whatever their width, add nothing)."""
        kept = [p for p in parts if len(p)] or list(parts[:1])
        return cls(*(np.concatenate([getattr(p, f) for p in kept]) for f in _COLUMN_FIELDS))

    def select(self, mask: np.ndarray) -> Columns:
        return Columns(*(getattr(self, f)[mask] for f in _COLUMN_FIELDS))

    def to_batch(self, user_buckets: int, item_buckets: int) -> Batch:
        user_hash, item_hash = hash_ids(self.user_id), hash_ids(self.item_id)
        return Batch(
            user_idx=torch.from_numpy((user_hash % np.uint64(user_buckets)).astype(np.int64)),
            item_idx=torch.from_numpy((item_hash % np.uint64(item_buckets)).astype(np.int64)),
            dense=torch.from_numpy(np.ascontiguousarray(self.features, dtype=np.float32)),
            label=torch.from_numpy(np.ascontiguousarray(self.label, dtype=np.float32)),
            event_time_ms=torch.from_numpy(self.event_time_ms),
            sample_hash=hash_ids(self.sample_id),
            user_hash=user_hash,
            item_hash=item_hash,
        )
