"""What a learner shares with the other ranks to take one step together when each rank learns from its
own samples (`trainer.rank_exchange = "gradients"`, gpu_trainer.distributed): the small per-sample
figures every rank needs (scores, labels, times, id hashes: the prequential metrics, the sample count,
digest and collision counts are those of all samples), and the gradients, summed. A process alone
shares with nobody.

>>> Alone().gather({"label": np.array([1.0])})["label"].tolist()
[1.0]
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

import numpy as np
from torch import nn


class StepExchange(Protocol):
    # whether other ranks step with this one (each on its own samples)
    distributed: bool

    def gather(self, mine: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every rank's arrays under each name, concatenated in rank order (the same on every rank)."""

    def reduce_grads(self, params: Mapping[str, nn.Parameter], sparse: Collection[str]) -> None:
        """Replaces every parameter's gradient by the sum of all ranks' (the `sparse` ones row-sparse)."""


class Alone:
    distributed = False

    def gather(self, mine: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(mine)

    def reduce_grads(self, params: Mapping[str, nn.Parameter], sparse: Collection[str]) -> None:
        return None
