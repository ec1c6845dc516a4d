"""The lag-based scaling policy: how many trainer workers the samples topic's consumer lag calls for.

One worker per `lag_per_worker` messages of lag, between `min_workers` and `max_workers`, capped by
the partition count (a worker without a partition would only wait). Two guards keep it from flapping:
a cooldown after every change (short for scaling up, long for scaling down), and hysteresis on the
way down: fewer workers only once the lag is `down_margin` below what the smaller count handles.

Pure: `decide` takes the observed lag and the time and returns the next decision; the controller that
reads the lag from Kafka and changes the number of ranks applies it.

>>> p = ScalingPolicy()
>>> p.target(lag=4_500, partitions=12)
5
>>> d = p.decide(Scale(workers=2, changed_at_s=None), lag=4_500, partitions=12, now_s=0.0)
>>> d.workers, d.reason
(5, 'lag 4500 calls for 5 workers (1000 each)')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from core.settings import AutoscaleSettings


@dataclass(frozen=True)
class Scale:
    """The current number of workers and when it last changed (None: never)."""

    workers: int
    changed_at_s: float | None


@dataclass(frozen=True)
class Decision:
    workers: int
    changed: bool
    reason: str


@dataclass(frozen=True)
class ScalingPolicy:
    cfg: AutoscaleSettings = field(default_factory=AutoscaleSettings)

    def bounds(self, partitions: int) -> tuple[int, int]:
        """(fewest, most) workers for a topic of `partitions` partitions."""
        most = max(1, min(self.cfg.max_workers, partitions))
        return min(self.cfg.min_workers, most), most

    def target(self, lag: int, partitions: int) -> int:
        """The workers `lag` calls for, within the bounds, before cooldowns and hysteresis."""
        fewest, most = self.bounds(partitions)
        return max(fewest, min(most, math.ceil(max(lag, 0) / self.cfg.lag_per_worker)))

    def decide(self, scale: Scale, lag: int, partitions: int, now_s: float) -> Decision:
        fewest, most = self.bounds(partitions)
        current = scale.workers
        if not fewest <= current <= most:  # the bounds moved (settings, partitions): follow at once
            bounded = max(fewest, min(most, current))
            return Decision(bounded, True, f"{current} workers are outside [{fewest}, {most}]")
        wanted = self.target(lag, partitions)
        since = math.inf if scale.changed_at_s is None else now_s - scale.changed_at_s
        if wanted > current:
            if since < self.cfg.up_cooldown_s:
                return Decision(current, False, f"lag {lag} calls for {wanted}, cooling down after the last change")
            return Decision(wanted, True, f"lag {lag} calls for {wanted} workers ({self.cfg.lag_per_worker} each)")
        if wanted < current:
            # Hysteresis: the smaller count must handle the lag with room to spare (down_margin).
            spared = max(wanted, math.ceil(max(lag, 0) / (self.cfg.lag_per_worker * (1.0 - self.cfg.down_margin))))
            if spared >= current:
                return Decision(current, False, f"lag {lag} is within the margin of {current} workers")
            if since < self.cfg.down_cooldown_s:
                return Decision(current, False, f"lag {lag} allows {spared}, cooling down after the last change")
            return Decision(spared, True, f"lag {lag} needs only {spared} workers")
        return Decision(current, False, f"lag {lag} matches {current} workers")


def simulate(policy: ScalingPolicy, trace: Callable[[float], int], seconds: int, partitions: int = 32,
             every_s: int = 10) -> list[tuple[float, int, int]]:
    """(time, lag, workers after the decision) for `trace` observed every `every_s` seconds, starting
    at the fewest workers.

    >>> simulate(ScalingPolicy(), lambda t: 4_500, 30)
    [(0.0, 4500, 5), (10.0, 4500, 5), (20.0, 4500, 5)]
    """
    scale, history = Scale(policy.bounds(partitions)[0], None), []
    for t in range(0, seconds, every_s):
        lag = trace(float(t))
        d = policy.decide(scale, lag, partitions, float(t))
        if d.changed:
            scale = Scale(d.workers, float(t))
        history.append((float(t), lag, scale.workers))
    return history
