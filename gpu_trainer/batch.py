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
    history_idx: torch.Tensor | None = None  # int64 [B, H]: the user's recent items' buckets, -1 pads

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def head(self, rows: int) -> Batch:
        """The first `rows` samples (views, no copies)."""
        if rows >= len(self):
            return self
        return Batch(self.user_idx[:rows], self.item_idx[:rows], self.dense[:rows], self.label[:rows],
                     self.event_time_ms[:rows], self.sample_hash[:rows],
                     None if self.user_hash is None else self.user_hash[:rows],
                     None if self.item_hash is None else self.item_hash[:rows],
                     None if self.history_idx is None else self.history_idx[:rows])

    @classmethod
    def concat(cls, parts: Sequence[Batch]) -> Batch:
        """The rows of `parts`, in order (empty parts add nothing)."""
        kept = [p for p in parts if len(p)] or list(parts[:1])

        def hashes(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in kept]
            return None if any(a is None for a in arrays) else np.concatenate(arrays)

        histories = [p.history_idx for p in kept]
        return cls(*(torch.cat([getattr(p, n) for p in kept]) for n in ("user_idx", "item_idx", "dense", "label",
                                                                        "event_time_ms")),
                   sample_hash=np.concatenate([p.sample_hash for p in kept]), user_hash=hashes("user_hash"),
                   item_hash=hashes("item_hash"),
                   history_idx=None if any(h is None for h in histories) else torch.cat(histories))  # type: ignore[arg-type]

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        names = ("user_idx", "item_idx", "dense", "label") + (("history_idx",) if self.history_idx is not None else ())
        if device.type == "cuda":
            move = {k: getattr(self, k).pin_memory().to(device, non_blocking=non_blocking) for k in names}
        else:
            move = {k: getattr(self, k).to(device) for k in names}
        return Batch(**move, event_time_ms=self.event_time_ms, sample_hash=self.sample_hash,
                     user_hash=self.user_hash, item_hash=self.item_hash)


# the TrainingSample fields the columns are made of (recent_items too, for a model that reads them)
COLUMN_SOURCES = ("sample_id", "user_id", "item_id", "features", "label", "event_time", "feature_set")
_COLUMN_FIELDS = ("sample_id", "user_id", "item_id", "features", "feature_len", "label", "event_time_ms",
                  "feature_set", "history_hash", "history_len")


def history_matrix(flat_items: np.ndarray, lengths: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first `length` recent items (newest first) as id hashes [B, length] and their count.

    >>> hashes, counts = history_matrix(np.array(["a", "b", "c"], dtype=object), np.array([2, 0, 1]), 1)
    >>> counts.tolist(), bool(hashes[0, 0] == hash_ids(["a"])[0]), bool(hashes[2, 0] == hash_ids(["c"])[0])
    ([1, 0, 1], True, True)
    """
    rows = len(lengths)
    lengths = np.asarray(lengths, dtype=np.int64)
    matrix = np.zeros((rows, length), dtype=np.uint64)
    kept = np.minimum(lengths, length)
    if length and len(flat_items):
        starts = np.cumsum(lengths) - lengths
        row = np.repeat(np.arange(rows), kept)
        col = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
        matrix[row, col] = hash_ids(flat_items[starts[row] + col])
    return matrix, kept


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
    history_hash: np.ndarray | None = None  # uint64 [B, H]: hashes of the user's recent items, newest first
    history_len: np.ndarray | None = None  # int64 [B]: how many of a row's H are recent items

    def __post_init__(self) -> None:
        if self.history_hash is None:
            self.history_hash = np.zeros((len(self.label), 0), dtype=np.uint64)
            self.history_len = np.zeros(len(self.label), dtype=np.int64)

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]], width: int | None = None,
                     history_length: int = 0) -> Columns:
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
        recent = [r.get("recent_items") or [] for r in records]
        history = history_matrix(np.array([i for items in recent for i in items], dtype=object),
                                 np.array([len(items) for items in recent], dtype=np.int64), history_length)
        return cls(frame["sample_id"].to_numpy(), frame["user_id"].to_numpy(), frame["item_id"].to_numpy(),
                   features, lengths, frame["label"].to_numpy(dtype=np.float32),
                   frame["event_time"].to_numpy(np.int64), frame["feature_set"].to_numpy(), *history)

    @classmethod
    def from_decoded(cls, decoded: BulkDecoded, width: int, history_length: int = 0) -> Columns:
        """From TrainingSample columns decoded in bulk; the decoder already cut or padded the feature
        matrix to its width (schemas.bulk), which must be the model's `width`."""
        columns = decoded.columns
        features = columns["features"]
        if features.shape[1] != width:
            raise ValueError(f"samples decoded {features.shape[1]} features wide, the model takes {width}")
        history = (history_matrix(columns["recent_items"], decoded.lengths["recent_items"], history_length)
                   if history_length else (None, None))
        return cls(columns["sample_id"], columns["user_id"], columns["item_id"], features,
                   decoded.lengths["features"], columns["label"].astype(np.float32), columns["event_time"],
                   columns["feature_set"], *history)

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
        history_idx = None
        assert self.history_hash is not None and self.history_len is not None
        if self.history_hash.shape[1]:
            history_idx = torch.from_numpy(history_buckets(self.history_hash, self.history_len, item_buckets))
        return Batch(
            user_idx=torch.from_numpy((user_hash % np.uint64(user_buckets)).astype(np.int64)),
            item_idx=torch.from_numpy((item_hash % np.uint64(item_buckets)).astype(np.int64)),
            dense=torch.from_numpy(np.ascontiguousarray(self.features, dtype=np.float32)),
            label=torch.from_numpy(np.ascontiguousarray(self.label, dtype=np.float32)),
            event_time_ms=torch.from_numpy(self.event_time_ms),
            sample_hash=hash_ids(self.sample_id),
            user_hash=user_hash,
            item_hash=item_hash,
            history_idx=history_idx,
        )


def history_buckets(hashes: np.ndarray, lengths: np.ndarray, item_buckets: int) -> np.ndarray:
    """The model's history input from `history_matrix`'s hashes: item buckets, -1 past each row's length.

    >>> history_buckets(np.array([[7, 9, 0]], dtype=np.uint64), np.array([2]), 4).tolist()
    [[3, 1, -1]]
    """
    buckets = (hashes % np.uint64(item_buckets)).astype(np.int64)
    present = np.arange(hashes.shape[1])[None, :] < lengths[:, None]
    return np.where(present, buckets, -1)
