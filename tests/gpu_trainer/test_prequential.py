from __future__ import annotations

import itertools

import numpy as np

from gpu_trainer.prequential import Prequential, auc, logloss


def brute_force_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = [(1.0 if p > n else 0.5 if p == n else 0.0) for p, n in itertools.product(pos, neg)]
    return float(np.mean(pairs))


def test_auc_matches_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=200).astype(float)
    labels = (rng.random(200) < 0.3).astype(int)
    assert abs(auc(scores, labels) - brute_force_auc(scores, labels)) < 1e-12
    assert auc(scores, np.zeros(200)) is None


def test_logloss() -> None:
    assert abs(logloss(np.array([0.5, 0.5]), np.array([0, 1])) - np.log(2)) < 1e-12


def test_rolling_window_keeps_only_the_latest() -> None:
    pq = Prequential(window=4)
    pq.update(np.array([0.9, 0.1]), np.array([0, 1]))  # perfectly wrong
    assert pq.auc() == 0.0
    pq.update(np.array([0.9, 0.8, 0.1, 0.2]), np.array([1, 1, 0, 0]))  # pushes the old ones out
    assert pq.auc() == 1.0
    assert [h["samples"] for h in pq.history] == [2, 6]
