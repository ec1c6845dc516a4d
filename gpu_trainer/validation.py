"""Which decoded samples may enter a micro-batch; the others become rejects with their reason.

>>> import numpy as np
>>> from gpu_trainer.batch import Columns
>>> cols = Columns.from_records([{"sample_id": "s1", "user_id": "u", "item_id": "i", "features": [1.0, 2.0],
...                               "label": 2.0, "event_time": 0, "feature_set": "v1"}])
>>> mask, rejects = check_samples(cols, n_features=2, feature_set="v1", topic="t")
>>> mask.tolist(), rejects[0].reason, rejects[0].key
([False], 'sample s1: label 2.0 is not 0 or 1', b'sample:s1')
"""

from __future__ import annotations

import numpy as np

from gpu_trainer.batch import Columns, id_lengths
from schemas.dead_letter import Reject
from schemas.utf8_column import Utf8Column


def check_samples(columns: Columns, n_features: int, feature_set: str, topic: str,
                  max_id_length: int = 256) -> tuple[np.ndarray, list[Reject]]:
    """A mask of the usable samples, and a reject for each other one, keyed by its sample id (so a
    restart that reads it again can tell it was dead-lettered already)."""
    wrong_len = columns.feature_len != n_features
    wrong_set = columns.feature_set != feature_set
    non_finite = ~np.isfinite(columns.features).all(axis=1) if len(columns) else np.zeros(0, dtype=bool)
    bad_label = ~np.isin(columns.label, (0.0, 1.0))
    ids = (columns.sample_id, columns.user_id, columns.item_id)
    bad_id = np.zeros(len(columns), dtype=bool)
    for column in ids:
        # a block's ids counted in bytes decide alike (a character takes one byte or more) unless one
        # has more bytes than characters allowed; counting characters took half of these checks
        lengths = column.byte_lengths() if isinstance(column, Utf8Column) else id_lengths(column)
        if isinstance(column, Utf8Column) and (lengths > max_id_length).any():
            lengths = id_lengths(column)
        bad_id |= (lengths == 0) | (lengths > max_id_length)
    bad = wrong_len | wrong_set | non_finite | bad_label | bad_id
    lengths_of_ids = [id_lengths(column) for column in ids] if bad_id.any() else []
    rejects = []
    for i in np.flatnonzero(bad):
        if wrong_len[i]:
            reason = f"expected {n_features} features, got {columns.feature_len[i]}"
        elif wrong_set[i]:
            reason = f"feature set {columns.feature_set[i]!r}, trainer expects {feature_set!r}"
        elif non_finite[i]:
            reason = "non-finite feature value (NaN or inf)"
        elif bad_label[i]:
            reason = f"label {columns.label[i]} is not 0 or 1"
        else:
            sizes = ", ".join(f"{name} {lengths[i]}" for name, lengths in zip(("sample id", "user id", "item id"),
                                                                               lengths_of_ids, strict=True))
            reason = f"an id is empty or longer than {max_id_length} characters ({sizes})"
        sample = str(columns.sample_id[i])[:max_id_length]
        rejects.append(Reject(f"sample {sample}: {reason}", topic, key=sample_key(sample)))
    return ~bad, rejects


def sample_key(sample_id: str) -> bytes:
    """The dead-letter key of a refused sample."""
    return f"sample:{sample_id}".encode()
