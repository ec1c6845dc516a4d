"""The lag-based scaling policy on simulated lag traces: it follows a burst and a ramp, stays put on
an idle topic, does not flap on a lag that oscillates around a threshold, and respects its bounds."""

from __future__ import annotations

from collections.abc import Callable

from core.settings import AutoscaleSettings
from gpu_trainer.scaling import Scale, ScalingPolicy, simulate

POLICY = ScalingPolicy(AutoscaleSettings())  # 1,000 per worker, 2..20, 30 s up, 300 s down


def run(trace: Callable[[float], int], seconds: int, partitions: int = 32, every_s: int = 10,
        policy: ScalingPolicy = POLICY) -> list[tuple[float, int]]:
    """(time, workers) after every observation of `trace` every `every_s` seconds."""
    return [(t, w) for t, _, w in simulate(policy, trace, seconds, partitions, every_s)]


def changes(history: list[tuple[float, int]]) -> int:
    return sum(1 for (_, a), (_, b) in zip(history, history[1:], strict=False) if a != b)


def workers_at(history: list[tuple[float, int]], t: float) -> int:
    return [w for when, w in history if when <= t][-1]


def test_idle_stays_at_the_minimum() -> None:
    history = run(lambda t: 0, 3600)
    assert {w for _, w in history} == {2} and changes(history) == 0


def test_a_burst_is_followed_up_at_once_and_down_only_after_the_cooldown() -> None:
    history = run(lambda t: 15_000 if 600 <= t < 700 else 100, 3600)  # 100 s of 15,000 messages
    assert workers_at(history, 590) == 2
    assert workers_at(history, 600) == 15  # the first observation of the burst
    assert workers_at(history, 890) == 15  # the lag is gone at 700, but the last change was at 600
    assert workers_at(history, 900) == 2
    assert changes(history) == 2


def test_a_ramp_only_goes_up_and_stops_at_the_maximum() -> None:
    history = run(lambda t: int(t * 50), 1200)  # +50 messages/s, 60,000 at the end
    workers = [w for _, w in history]
    assert workers == sorted(workers) and workers[-1] == 20
    # never behind by more than the up cooldown allows: at t the lag is 50 t, the target ceil(50 t / 1000)
    for t, w in history:
        assert w >= min(20, POLICY.target(int((t - POLICY.cfg.up_cooldown_s) * 50), 32))


def test_a_lag_oscillating_around_a_threshold_does_not_flap() -> None:
    history = run(lambda t: 3_100 if (t // 10) % 2 else 2_900, 3600)
    assert changes(history) <= 1 and workers_at(history, 3590) == 4


def test_partitions_cap_the_workers_and_the_bounds_are_followed() -> None:
    assert POLICY.target(50_000, partitions=6) == 6
    assert POLICY.target(50_000, partitions=1) == 1 and POLICY.bounds(1) == (1, 1)
    assert POLICY.target(0, partitions=6) == 2
    d = POLICY.decide(Scale(8, changed_at_s=0.0), lag=9_000, partitions=6, now_s=1.0)
    assert d.changed and d.workers == 6 and "outside" in d.reason  # partitions went down: no cooldown


def test_scaling_down_goes_as_far_as_the_margin_allows() -> None:
    d = POLICY.decide(Scale(10, changed_at_s=0.0), lag=4_500, partitions=32, now_s=1_000.0)
    assert d.changed and d.workers == 6  # 4,500 / (1,000 x 0.8) -> 6, not the bare target 5
    d = POLICY.decide(Scale(10, changed_at_s=900.0), lag=4_500, partitions=32, now_s=1_000.0)
    assert not d.changed and "cooling down" in d.reason
