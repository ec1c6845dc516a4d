"""The gate of shadow learners: several variants of the update rule (plain, EMA, EWC at some λ) learn side
by side from the same micro-batches, each scoring a batch before it learns from it; the gate says which
variant's weights to publish. No fixed rule wins on every stream (EMA costs a little everywhere, EWC
helps stable logs and costs under drift), so the stream chooses.

Each variant's prequential AUC is kept over the same trailing window of samples. A challenger takes the
lead only after it has beaten the leader by `margin` at `patience` consecutive checks (hysteresis: two
variants within noise of each other do not swap back and forth). Checks come once per window by
default, so that consecutive checks judge different samples: with overlapping windows one lucky
stretch would count several times.

>>> import numpy as np
>>> gate = ShadowGate(["plain", "ema"], window=400, check_every=100, patience=2, margin=0.01)
>>> labels = np.tile([0.0, 1.0], 50)
>>> good, poor = labels * 0.8 + 0.1, np.full(100, 0.5)
>>> [gate.update({"plain": poor, "ema": good}, labels) for _ in range(3)]
['plain', 'ema', 'ema']
>>> gate.switches[0]["to"], gate.switches[0]["reason"]
('ema', 'AUC 1.0000 against 0.5000 for plain at 2 checks in a row (margin 0.01)')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_trainer.prequential import Prequential


@dataclass
class ShadowGate:
    names: list[str]
    window: int = 20_000
    margin: float = 0.005
    patience: int = 2
    check_every: int | None = None  # None: once per window
    leader: str = field(init=False)
    switches: list[dict[str, Any]] = field(default_factory=list, init=False)
    _scores: dict[str, Prequential] = field(init=False)
    _since_check: int = field(default=0, init=False)
    _streak: tuple[str | None, int] = field(default=(None, 0), init=False)
    _samples: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("a shadow gate needs at least one variant")
        self.leader = self.names[0]
        # history is not needed here: one entry per checked window at most
        self._scores = {n: Prequential(self.window, history_every=10**12) for n in self.names}

    def update(self, probs: dict[str, np.ndarray], labels: np.ndarray) -> str:
        """Every variant's scores of one batch, made before any learned from it; returns the variant to
        publish after it (the leader the next batch is served by)."""
        for name in self.names:
            self._scores[name].update(probs[name], labels)
        self._samples += len(labels)
        self._since_check += len(labels)
        if self._since_check >= (self.check_every or self.window):
            self._since_check = 0
            self._check()
        return self.leader

    def aucs(self) -> dict[str, float | None]:
        return {n: s.auc() for n, s in self._scores.items()}

    def _check(self) -> None:
        aucs = self.aucs()
        held = aucs[self.leader]
        rivals = {n: a for n, a in aucs.items() if a is not None and n != self.leader}
        if held is None or not rivals:
            return
        best = max(rivals, key=lambda n: rivals[n])
        if rivals[best] < held + self.margin:
            self._streak = (None, 0)
            return
        streak = self._streak[1] + 1 if self._streak[0] == best else 1
        self._streak = (best, streak)
        if streak >= self.patience:
            self.switches.append({"samples": self._samples, "from": self.leader, "to": best, "aucs": aucs,
                                  "reason": f"AUC {rivals[best]:.4f} against {held:.4f} for {self.leader} at "
                                            f"{streak} checks in a row (margin {self.margin:g})"})
            self.leader = best
            self._streak = (None, 0)
