"""A peer baseline for `rtrec evaluate --peer river`: River's factorization machine on the same samples,
in the same order, each scored before it is learned (River is an optional extra: `pip install river`).

A sample becomes River's dict of features: the user and the item as strings, which River's FM one-hot
encodes itself (a latent vector per value, as our models learn an embedding per bucket), and the window
features log-scaled and then standardised online by River's `StandardScaler`, the usual River pipeline.
Log-scaling alone was not enough: ages reach 10^5 s, and with River's defaults the FM's feature
interactions overflowed on the synthetic drift stream (AUC 0.49, NaN logloss)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from gpu_trainer.batch import Columns
from schemas.feature_set import FEATURE_NAMES


class PeerMissing(RuntimeError):
    pass


def _river_model(n_factors: int, seed: int) -> Any:
    try:
        from river import compose, facto, preprocessing
    except ImportError as exc:
        raise PeerMissing("the River baseline needs River: pip install river (the project's `peer` extra)") from exc
    features = compose.TransformerUnion(compose.Select("user", "item"),
                                        compose.Select(*FEATURE_NAMES) | preprocessing.StandardScaler())
    return features | facto.FMClassifier(n_factors=n_factors, seed=seed)  # River's own defaults otherwise


def river_row(columns: Columns, i: int) -> dict[str, float | str]:
    x: dict[str, float | str] = {"user": str(columns.user_id[i]), "item": str(columns.item_id[i])}
    for name, value in zip(FEATURE_NAMES, columns.features[i], strict=False):
        x[name] = math.log1p(max(float(value), 0.0))
    return x


def river_fm(head: Columns, tail: Columns, epochs: int, n_factors: int = 10, seed: int = 0) -> tuple[np.ndarray, float]:
    """Learns the head `epochs` times, then scores each tail sample and learns it. Returns the tail's
    probabilities and the streaming phase's samples per second (score and learn)."""
    model = _river_model(n_factors, seed)
    for _ in range(epochs):
        for i in range(len(head)):
            model.learn_one(river_row(head, i), bool(head.label[i]))
    probs = np.empty(len(tail))
    started = time.perf_counter()
    for i in range(len(tail)):
        x = river_row(tail, i)
        probs[i] = model.predict_proba_one(x).get(True, 0.0)
        model.learn_one(x, bool(tail.label[i]))
    return probs, len(tail) / max(time.perf_counter() - started, 1e-9)
