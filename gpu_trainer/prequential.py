"""Prequential (test-then-train) evaluation: each batch is scored before the model learns from it.

>>> import numpy as np
>>> round(auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])), 3)
0.75
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """ROC AUC by the rank-sum (Mann-Whitney) formula, ties averaged; None with one class only."""
    labels = labels.astype(bool)
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores)  # ties get their average rank, so no stable sort is needed (2.5x faster)
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    # average ranks over ties
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(probs: np.ndarray, labels: np.ndarray) -> float:
    p = np.clip(probs, 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


@dataclass
class Prequential:
    """Rolling-window AUC and logloss over the last `window` predictions, plus a history per batch.

    Each history entry has the batch's own AUC; the rolling AUC and logloss go into it once per
    `history_every` samples (None in the entries between): each costs a sort of the whole window,
    which per batch took about half of a training step on small batches.
    """

    window: int = 20_000
    history_every: int = 5_000
    _probs: np.ndarray = field(init=False)
    _labels: np.ndarray = field(init=False)
    _n: int = field(default=0, init=False)
    _history_at: int = field(default=0, init=False)
    history: list[dict[str, float | int | None]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._probs = np.zeros(self.window, dtype=np.float64)
        self._labels = np.zeros(self.window, dtype=np.float64)

    def update(self, probs: np.ndarray, labels: np.ndarray, at_ms: int | None = None) -> None:
        k = len(probs)
        if k >= self.window:
            probs, labels, k = probs[-self.window:], labels[-self.window:], self.window
        idx = (self._n + np.arange(k)) % self.window
        self._probs[idx], self._labels[idx] = probs, labels
        self._n += k
        rolling = self._n - self._history_at >= self.history_every or self._history_at == 0
        if rolling:
            self._history_at = self._n
        self.history.append({"samples": self._n, "at_ms": at_ms, "auc": self.auc() if rolling else None,
                             "logloss": self.logloss() if rolling else None, "batch_auc": auc(probs, labels)})

    def _filled(self) -> tuple[np.ndarray, np.ndarray]:
        n = min(self._n, self.window)
        return self._probs[:n], self._labels[:n]

    def auc(self) -> float | None:
        return auc(*self._filled())

    def logloss(self) -> float | None:
        probs, labels = self._filled()
        return logloss(probs, labels) if len(probs) else None


@dataclass
class ScoreLog:
    """Every sample a learner scored before learning from it: id hash, event time, score, label (32 bytes
    a sample). Kept only where asked for (`rtrec demo`), to score another model on the same samples.

    >>> log = ScoreLog()
    >>> log.add(np.array([7, 9], dtype=np.uint64), np.array([5, 6]), np.array([0.2, 0.9]), np.array([0.0, 1.0]))
    >>> log.arrays()["score"].tolist()
    [0.2, 0.9]
    """

    _parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list, init=False)

    def add(self, sample_hash: np.ndarray, time_ms: np.ndarray, score: np.ndarray, label: np.ndarray) -> None:
        self._parts.append((sample_hash.astype(np.uint64), time_ms.astype(np.int64), score.astype(np.float64),
                            label.astype(np.float64)))

    def arrays(self) -> dict[str, np.ndarray]:
        names = ("sample_hash", "time_ms", "score", "label")
        if not self._parts:
            return {name: np.zeros(0) for name in names}
        return {name: np.concatenate([part[i] for part in self._parts]) for i, name in enumerate(names)}
