"""The scaling policy (gpu_trainer/scaling.py, default trainer.autoscale settings) on simulated lag traces:
a table of what it did and `benchmarks/out/scaling_traces.png` (lag, the workers the lag alone calls for,
and the workers the policy keeps, over time). The same traces are asserted in tests/gpu_trainer/test_scaling.py.

Run: `.venv/bin/python -m benchmarks.scaling_traces`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from gpu_trainer.scaling import ScalingPolicy, simulate

OUT = Path(__file__).parent / "out"
PARTITIONS = 32
TRACES: dict[str, tuple[Callable[[float], int], int]] = {
    "idle": (lambda t: 0, 3600),
    "burst (15,000 for 100 s)": (lambda t: 15_000 if 600 <= t < 700 else 100, 3600),
    "ramp (+50/s)": (lambda t: int(t * 50), 1200),
    "oscillation (2,900 / 3,100)": (lambda t: 3_100 if (t // 10) % 2 else 2_900, 3600),
}


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policy = ScalingPolicy()
    fig, axes = plt.subplots(len(TRACES), 1, figsize=(9, 2.6 * len(TRACES)), sharex=False)
    print(f"{'trace':30} {'changes':>7} {'min':>4} {'max':>4} {'mean':>6} {'target changes':>14}")
    for ax, (name, (trace, seconds)) in zip(axes, TRACES.items(), strict=True):
        history = simulate(policy, trace, seconds, PARTITIONS)
        times = [t for t, _, _ in history]
        lags = [lag for _, lag, _ in history]
        workers = [w for _, _, w in history]
        targets = [policy.target(lag, PARTITIONS) for lag in lags]
        changes = sum(1 for a, b in zip(workers, workers[1:], strict=False) if a != b)
        target_changes = sum(1 for a, b in zip(targets, targets[1:], strict=False) if a != b)
        print(f"{name:30} {changes:>7} {min(workers):>4} {max(workers):>4} {sum(workers) / len(workers):>6.1f} "
              f"{target_changes:>14}")
        ax.plot(times, lags, color="tab:gray", label="lag (records)")
        ax.set_ylabel("lag")
        ax.set_title(name, fontsize=10)
        twin = ax.twinx()
        twin.step(times, targets, where="post", color="tab:orange", linestyle="--", label="lag alone calls for")
        twin.step(times, workers, where="post", color="tab:blue", label="workers (policy)")
        twin.set_ylabel("workers")
        twin.set_ylim(0, policy.cfg.max_workers + 1)
    axes[-1].set_xlabel("seconds")
    handles = [h for ax in fig.axes[:1] + fig.axes[len(TRACES):len(TRACES) + 1]
               for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize=8)
    fig.tight_layout()
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / "scaling_traces.png", dpi=100)
    print(f"wrote {OUT / 'scaling_traces.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
