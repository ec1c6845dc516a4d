"""The dense feature vector the trainer learns from and the scorer rebuilds from Redis.

A TrainingSample's `features` follow `FEATURE_NAMES` of its `feature_set`. Missing values are 0.

>>> len(FEATURE_NAMES)
20
>>> FEATURE_NAMES[0]
'user.60s.impressions'
"""

from __future__ import annotations

FEATURE_SET = "v1"
HORIZONS_S = (60, 600)
AGGREGATES = ("impressions", "clicks", "likes", "ctr", "dwell_mean_ms")
ENTITY_TYPES = ("user", "item")
FEATURE_NAMES = [f"{e}.{h}s.{a}" for e in ENTITY_TYPES for h in HORIZONS_S for a in AGGREGATES]


def names_for(entity_type: str) -> list[str]:
    """The store-level names (`'60s.ctr'`) one entity type contributes, in vector order."""
    return [n.split(".", 1)[1] for n in FEATURE_NAMES if n.startswith(entity_type + ".")]
