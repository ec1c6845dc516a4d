"""A typed micro-batch and its bulk construction from decoded TrainingSample records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from gpu_trainer.siphash import utf8_hashes
from schemas.bulk import BulkDecoded
from schemas.utf8_column import Utf8Column, concat_columns

# Fixed 16-byte key: bucket ids must be the same in every process (training, scoring, ONNX callers).
_HASH_KEY = "rtrec-id-hash-01"


IdColumn = np.ndarray | Utf8Column  # ids as strings, or as a block's UTF-8 bytes


def hash_ids(ids: Sequence[str] | IdColumn, distinct: bool = False) -> np.ndarray:
    """Stable 64-bit hashes of string ids, vectorised (SipHash via pandas; the same hashes in numpy
    for ids still in their UTF-8 bytes). Repeated ids (users, items) are hashed once each; `distinct`
    ones (sample ids) directly, which skips the pass that finds the repeats (2.7 times faster for
    4,096 sample ids) and gives the same hashes.

    >>> int(hash_ids(["u1"])[0]) == int(hash_ids(np.array(["u1"], dtype=object))[0])
    True
    >>> hash_ids(["s1", "s2"], distinct=True).tolist() == hash_ids(["s1", "s2"]).tolist()
    True
    >>> hash_ids(Utf8Column.from_strings(["s1", "é"])).tolist() == hash_ids(["s1", "é"]).tolist()
    True
    """
    if isinstance(ids, Utf8Column):
        return utf8_hashes(ids, _HASH_KEY)
    return pd.util.hash_array(np.asarray(ids, dtype=object), hash_key=_HASH_KEY, categorize=not distinct)


def id_lengths(ids: IdColumn) -> np.ndarray:
    """Each id's length in characters."""
    if isinstance(ids, Utf8Column):
        return ids.char_lengths()
    return np.fromiter(map(len, ids), np.int64, len(ids))


def _id_hashes(sample_ids: IdColumn, *repeating: IdColumn) -> list[np.ndarray]:
    """hash_ids of each column; a block's id columns in one pass (fewer numpy calls than one a column)."""
    columns = (sample_ids, *repeating)
    if not all(isinstance(c, Utf8Column) for c in columns):
        return [hash_ids(sample_ids, distinct=True), *(hash_ids(c) for c in repeating)]
    hashes = hash_ids(Utf8Column.concat(columns))  # type: ignore[arg-type]
    return np.split(hashes, np.cumsum([len(c) for c in columns[:-1]]))


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
    history_type: torch.Tensor | None = None  # int64 [B, H]: their event types' buckets (HISTORY_TYPE_BUCKETS)
    history_age: torch.Tensor | None = None  # int64 [B, H]: their ages' buckets (`age_buckets`)

    _HISTORY = ("history_idx", "history_type", "history_age")

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def model_inputs(self) -> tuple[torch.Tensor | None, ...]:
        """What every model's forward takes, in its order."""
        return self.user_idx, self.item_idx, self.dense, self.history_idx, self.history_type, self.history_age

    def head(self, rows: int) -> Batch:
        """The first `rows` samples (views, no copies)."""
        if rows >= len(self):
            return self
        return Batch(self.user_idx[:rows], self.item_idx[:rows], self.dense[:rows], self.label[:rows],
                     self.event_time_ms[:rows], self.sample_hash[:rows],
                     None if self.user_hash is None else self.user_hash[:rows],
                     None if self.item_hash is None else self.item_hash[:rows],
                     *(None if getattr(self, n) is None else getattr(self, n)[:rows] for n in self._HISTORY))

    @classmethod
    def concat(cls, parts: Sequence[Batch]) -> Batch:
        """The rows of `parts`, in order (empty parts add nothing)."""
        kept = [p for p in parts if len(p)] or list(parts[:1])

        def hashes(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in kept]
            return None if any(a is None for a in arrays) else np.concatenate(arrays)

        def tensors(name: str) -> torch.Tensor | None:
            parts = [getattr(p, name) for p in kept]
            return None if any(t is None for t in parts) else torch.cat(parts)

        return cls(*(torch.cat([getattr(p, n) for p in kept]) for n in ("user_idx", "item_idx", "dense", "label",
                                                                        "event_time_ms")),
                   sample_hash=np.concatenate([p.sample_hash for p in kept]), user_hash=hashes("user_hash"),
                   item_hash=hashes("item_hash"), **{n: tensors(n) for n in cls._HISTORY})

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        names = ("user_idx", "item_idx", "dense", "label") + tuple(n for n in self._HISTORY
                                                                   if getattr(self, n) is not None)
        if device.type == "cuda":
            move = {k: getattr(self, k).pin_memory().to(device, non_blocking=non_blocking) for k in names}
        else:
            move = {k: getattr(self, k).to(device) for k in names}
        return Batch(**move, event_time_ms=self.event_time_ms, sample_hash=self.sample_hash,
                     user_hash=self.user_hash, item_hash=self.item_hash)


# the TrainingSample fields the columns are made of (HISTORY_SOURCES too, for a model that reads them)
COLUMN_SOURCES = ("sample_id", "user_id", "item_id", "features", "label", "event_time", "feature_set")
HISTORY_SOURCES = ("recent_items", "recent_types", "recent_ages_ms")
ID_FIELDS = ("sample_id", "user_id", "item_id")
_COLUMN_FIELDS = ("sample_id", "user_id", "item_id", "features", "feature_len", "label", "event_time_ms",
                  "feature_set", "history_hash", "history_type_hash", "history_age_ms", "history_len")
# Bucket 0 of both means "not known" (a sample written before types and ages were, or a caller giving
# items alone); the others: hashed event types, and ages by powers of two seconds (1 + log2(1 + s)).
HISTORY_TYPE_BUCKETS = 16
HISTORY_AGE_BUCKETS = 16


@dataclass
class History:
    """Each row's first `length` recent engagements (newest first) as matrices [B, length]."""

    item_hash: np.ndarray  # uint64
    type_hash: np.ndarray  # uint64; 0 where not known
    age_ms: np.ndarray  # int64; -1 where not known
    length: np.ndarray  # int64 [B]: how many of a row's entries are recent items

    @classmethod
    def empty(cls, rows: int, length: int) -> History:
        return cls(np.zeros((rows, length), np.uint64), np.zeros((rows, length), np.uint64),
                   np.full((rows, length), -1, np.int64), np.zeros(rows, np.int64))


def _ragged_matrix(flat: np.ndarray, lengths: np.ndarray, length: int, fill: np.ndarray) -> np.ndarray:
    """Each row's first `length` items of the ragged `flat` (row counts `lengths`) into `fill` [B, length]."""
    kept = np.minimum(lengths, length)
    if length and len(flat):
        starts = np.cumsum(lengths) - lengths
        row = np.repeat(np.arange(len(lengths)), kept)
        col = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
        fill[row, col] = flat[starts[row] + col]
    return fill


def history_matrix(items: tuple[np.ndarray, np.ndarray], length: int,
                   types: tuple[np.ndarray, np.ndarray] | None = None,
                   ages_ms: tuple[np.ndarray, np.ndarray] | None = None) -> History:
    """Recent items, and their event types and ages where given, each as (flat values of all rows, row
    counts). A row whose types or ages do not match its items one for one gets them as not known.

    >>> h = history_matrix((np.array(["a", "b", "c"], dtype=object), np.array([2, 0, 1])), 1,
    ...                    ages_ms=(np.array([5, 7]), np.array([1, 0, 1])))
    >>> h.length.tolist(), bool(h.item_hash[0, 0] == hash_ids(["a"])[0]), h.age_ms.tolist(), h.type_hash.tolist()
    ([1, 0, 1], True, [[-1], [-1], [7]], [[0], [0], [0]])
    """
    flat_items, lengths = items[0], np.asarray(items[1], dtype=np.int64)
    history = History.empty(len(lengths), length)
    item_hash = hash_ids(flat_items) if len(flat_items) else np.zeros(0, np.uint64)
    _ragged_matrix(item_hash, lengths, length, history.item_hash)
    history.length = np.minimum(lengths, length)
    for given, matrix, convert in ((types, history.type_hash, hash_ids), (ages_ms, history.age_ms, None)):
        if given is None or not len(lengths):
            continue
        flat, counts = given
        counts = np.asarray(counts, dtype=np.int64)
        values = (convert(flat) if convert is not None and len(flat) else np.asarray(flat)).astype(matrix.dtype)
        filled = _ragged_matrix(values, counts, length, np.zeros_like(matrix) if convert else np.full_like(matrix, -1))
        matches = counts == lengths
        matrix[matches] = filled[matches]
    return history


def _ragged_field(records: Sequence[dict[str, Any]], name: str) -> tuple[np.ndarray, np.ndarray]:
    lists = [r.get(name) or [] for r in records]
    return np.array([v for values in lists for v in values], dtype=object), np.array([len(v) for v in lists])


@dataclass
class Columns:
    """Column arrays of a set of samples, before hashing into buckets."""

    sample_id: IdColumn
    user_id: IdColumn
    item_id: IdColumn
    features: np.ndarray  # float32 [B, F]; rows shorter than F are zero-padded
    feature_len: np.ndarray  # int64 [B], each record's own feature count
    label: np.ndarray
    event_time_ms: np.ndarray
    feature_set: np.ndarray
    # the user's recent engagements, newest first (History's matrices [B, H]; H = 0: not read)
    history_hash: np.ndarray | None = None
    history_type_hash: np.ndarray | None = None
    history_age_ms: np.ndarray | None = None
    history_len: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.history_hash is None:
            self._set_history(History.empty(len(self.label), 0))

    def _set_history(self, history: History) -> None:
        self.history_hash, self.history_type_hash = history.item_hash, history.type_hash
        self.history_age_ms, self.history_len = history.age_ms, history.length

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
        columns = cls(frame["sample_id"].to_numpy(), frame["user_id"].to_numpy(), frame["item_id"].to_numpy(),
                      features, lengths, frame["label"].to_numpy(dtype=np.float32),
                      frame["event_time"].to_numpy(np.int64), frame["feature_set"].to_numpy())
        if history_length:
            items, types, ages = (_ragged_field(records, name) for name in HISTORY_SOURCES)
            columns._set_history(history_matrix(items, history_length, types,
                                                (ages[0].astype(np.int64), ages[1])))
        return columns

    @classmethod
    def from_decoded(cls, decoded: BulkDecoded, width: int, history_length: int = 0) -> Columns:
        """From TrainingSample columns decoded in bulk; the decoder already cut or padded the feature
        matrix to its width (schemas.bulk), which must be the model's `width`. The recent items' types
        and ages are read where they were decoded."""
        columns = decoded.columns
        features = columns["features"]
        if features.shape[1] != width:
            raise ValueError(f"samples decoded {features.shape[1]} features wide, the model takes {width}")
        out = cls(columns["sample_id"], columns["user_id"], columns["item_id"], features,
                  decoded.lengths["features"], columns["label"].astype(np.float32), columns["event_time"],
                  columns["feature_set"])
        if history_length:
            given = [(columns[n], decoded.lengths[n]) if n in columns else None for n in HISTORY_SOURCES]
            assert given[0] is not None, "decode recent_items for a model that reads them"
            out._set_history(history_matrix(given[0], history_length, given[1], given[2]))
        return out

    def __len__(self) -> int:
        return len(self.label)

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        """The rows of `parts`, in order (empty parts, whatever their width, add nothing)."""
        kept = [p for p in parts if len(p)] or list(parts[:1])
        return cls(*(concat_columns([getattr(p, f) for p in kept]) for f in _COLUMN_FIELDS))

    def select(self, rows: np.ndarray) -> Columns:
        """The rows of a bool mask or of indices."""
        if rows.dtype == bool and rows.all():  # the usual poll: every sample passed its checks
            return self
        return Columns(*(getattr(self, f)[rows] for f in _COLUMN_FIELDS))

    def history(self) -> History:
        assert self.history_hash is not None and self.history_type_hash is not None
        assert self.history_age_ms is not None and self.history_len is not None
        return History(self.history_hash, self.history_type_hash, self.history_age_ms, self.history_len)

    def to_batch(self, user_buckets: int, item_buckets: int) -> Batch:
        sample_hash, user_hash, item_hash = _id_hashes(self.sample_id, self.user_id, self.item_id)
        history = self.history()
        inputs = history_inputs(history, item_buckets) if history.item_hash.shape[1] else (None, None, None)
        return Batch(
            user_idx=torch.from_numpy((user_hash % np.uint64(user_buckets)).astype(np.int64)),
            item_idx=torch.from_numpy((item_hash % np.uint64(item_buckets)).astype(np.int64)),
            dense=torch.from_numpy(np.ascontiguousarray(self.features, dtype=np.float32)),
            label=torch.from_numpy(np.ascontiguousarray(self.label, dtype=np.float32)),
            event_time_ms=torch.from_numpy(self.event_time_ms),
            sample_hash=sample_hash,
            user_hash=user_hash,
            item_hash=item_hash,
            history_idx=inputs[0],
            history_type=inputs[1],
            history_age=inputs[2],
        )


def history_buckets(hashes: np.ndarray, lengths: np.ndarray, item_buckets: int) -> np.ndarray:
    """The model's history input from `history_matrix`'s hashes: item buckets, -1 past each row's length.

    >>> history_buckets(np.array([[7, 9, 0]], dtype=np.uint64), np.array([2]), 4).tolist()
    [[3, 1, -1]]
    """
    buckets = (hashes % np.uint64(item_buckets)).astype(np.int64)
    present = np.arange(hashes.shape[1])[None, :] < lengths[:, None]
    return np.where(present, buckets, -1)


def type_buckets(type_hash: np.ndarray) -> np.ndarray:
    """Event types' buckets: 0 where not known (hash 0), else 1 to HISTORY_TYPE_BUCKETS - 1.

    >>> type_buckets(np.array([0, 15, 16], dtype=np.uint64)).tolist()
    [0, 1, 2]
    """
    known = type_hash != 0
    return np.where(known, 1 + (type_hash % np.uint64(HISTORY_TYPE_BUCKETS - 1)).astype(np.int64), 0)


def age_buckets(age_ms: np.ndarray) -> np.ndarray:
    """Ages' buckets by powers of two seconds: 0 where not known (< 0), 1 under a second, 2 for 1 s,
    ..., 12 for an hour, the last (15) from four and a half hours on.

    >>> age_buckets(np.array([-1, 0, 999, 1_000, 3_600_000, 10**12])).tolist()
    [0, 1, 1, 2, 12, 15]
    """
    seconds = np.maximum(np.asarray(age_ms, dtype=np.float64), 0.0) / 1000.0
    buckets = np.minimum(1 + np.floor(np.log2(1.0 + seconds)).astype(np.int64), HISTORY_AGE_BUCKETS - 1)
    return np.where(np.asarray(age_ms) < 0, 0, buckets)


def history_inputs(history: History, item_buckets: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The models' history inputs: item buckets (-1 pads), type buckets and age buckets, [B, H] each."""
    items = history_buckets(history.item_hash, history.length, item_buckets)
    return (torch.from_numpy(items), torch.from_numpy(type_buckets(history.type_hash)),
            torch.from_numpy(age_buckets(history.age_ms)))
