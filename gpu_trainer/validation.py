"""Which decoded samples may enter a micro-batch; the others become rejects with their reason.

>>> import numpy as np
>>> from gpu_trainer.batch import Columns
>>> cols = Columns.from_records([{"sample_id": "s1", "user_id": "u", "item_id": "i", "features": [1.0, 2.0],
...                               "label": 2.0, "event_time": 0, "feature_set": "v1"}])
>>> mask, rejects = check_samples(cols, n_features=2, feature_set="v1", topic="t")
>>> mask.tolist(), rejects[0].reason
([False], 'sample s1: label 2.0 is not 0 or 1')
"""

from __future__ import annotations

import numpy as np

from gpu_trainer.batch import Columns
from schemas.dead_letter import Reject


def check_samples(columns: Columns, n_features: int, feature_set: str, topic: str) -> tuple[np.ndarray, list[Reject]]:
    """A mask of the usable samples, and a reject for each other one."""
    wrong_len = columns.feature_len != n_features
    wrong_set = columns.feature_set != feature_set
    non_finite = ~np.isfinite(columns.features).all(axis=1) if len(columns) else np.zeros(0, dtype=bool)
    bad_label = ~np.isin(columns.label, (0.0, 1.0))
    bad = wrong_len | wrong_set | non_finite | bad_label
    rejects = []
    for i in np.flatnonzero(bad):
        if wrong_len[i]:
            reason = f"expected {n_features} features, got {columns.feature_len[i]}"
        elif wrong_set[i]:
            reason = f"feature set {columns.feature_set[i]!r}, trainer expects {feature_set!r}"
        elif non_finite[i]:
            reason = "non-finite feature value (NaN or inf)"
        else:
            reason = f"label {columns.label[i]} is not 0 or 1"
        rejects.append(Reject(f"sample {columns.sample_id[i]}: {reason}", topic))
    return ~bad, rejects
