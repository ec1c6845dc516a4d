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

from core.settings import TrainerSettings
from gpu_trainer.batch import Batch
from gpu_trainer.exchange import StepExchange
from gpu_trainer.learner import Learner, StepResult
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


def variant_settings(cfg: TrainerSettings, name: str) -> TrainerSettings:
    """The trainer settings of one variant: `plain`, `ema`, `ewc` or `ema+ewc`."""
    rules = set(name.split("+"))
    if not rules <= {"plain", "ema", "ewc"} or ("plain" in rules and len(rules) > 1):
        raise ValueError(f"unknown shadow variant {name!r}; known: plain, ema, ewc, ema+ewc")
    return cfg.model_copy(update={"ema_enabled": "ema" in rules, "ewc_enabled": "ewc" in rules})


class ShadowLearners:
    """Several learners of one model under different update rules (`trainer.shadow_variants`), stepped on
    the same batches; the gate's leader is the one the service publishes. To the service it is a
    learner: the leader's metrics and published weights, every variant's state in a snapshot
    (`variant/<name>/...` beside the leader's arrays under their usual names, which scorers read)."""

    def __init__(self, cfg: TrainerSettings, n_dense: int, exchange: StepExchange | None = None) -> None:
        self.cfg = cfg
        self.variants = {name: Learner(variant_settings(cfg, name), n_dense, exchange=exchange)
                         for name in cfg.shadow_variants}
        self.gate = ShadowGate(list(self.variants), window=cfg.eval_window, margin=cfg.shadow_margin)
        self.model_name, self.config = self.leader.model_name, self.leader.config

    @property
    def leader(self) -> Learner:
        return self.variants[self.gate.leader]

    # what the service reads of a learner: the leader's
    @property
    def prequential(self) -> Prequential:
        return self.leader.prequential

    @property
    def published_prequential(self) -> Prequential:
        return self.leader.published_prequential

    @property
    def collisions(self) -> dict[str, Any]:
        return self.leader.collisions

    @property
    def samples_trained(self) -> int:
        return self.leader.samples_trained

    @samples_trained.setter
    def samples_trained(self, value: int) -> None:
        for learner in self.variants.values():
            learner.samples_trained = value

    @property
    def sample_digest(self) -> int:
        return self.leader.sample_digest

    @sample_digest.setter
    def sample_digest(self, value: int) -> None:
        for learner in self.variants.values():
            learner.sample_digest = value

    def step(self, batch: Batch) -> StepResult:
        results = {name: learner.step(batch) for name, learner in self.variants.items()}
        scores = {name: learner.last_published_scores for name, learner in self.variants.items()}
        labels = self.leader.last_published_labels  # the same rows for every variant (all ranks' with ranks)
        if labels is not None and all(s is not None for s in scores.values()):
            self.gate.update(scores, labels.astype(np.float64))  # type: ignore[arg-type]
        return results[self.gate.leader]

    def consolidate(self) -> None:
        for learner in self.variants.values():
            learner.consolidate()

    def weights_are_finite(self) -> bool:
        return all(learner.weights_are_finite() for learner in self.variants.values())

    def published_state(self) -> dict[str, Any]:
        return self.leader.published_state()

    def variant_aucs(self) -> dict[str, float | None]:
        return {name: learner.published_prequential.auc() for name, learner in self.variants.items()}

    def state_arrays(self) -> dict[str, np.ndarray]:
        out = dict(self.leader.state_arrays())
        for name, learner in self.variants.items():
            out.update({f"variant/{name}/{key}": value for key, value in learner.state_arrays().items()})
        return out

    def load_state_arrays(self, arrays: dict[str, np.ndarray], leader: str | None = None) -> None:
        """Each variant from its own arrays; one a snapshot does not hold (an older snapshot, a variant
        added since) starts from the published model's."""
        for name, learner in self.variants.items():
            prefix = f"variant/{name}/"
            own = {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}
            base = {k: v for k, v in arrays.items() if not k.startswith("variant/")}
            learner.load_state_arrays(own or base)
        if leader in self.variants:
            self.gate.leader = leader
