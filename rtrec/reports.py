"""Figures of a run that a person would rather see than read: AUC over time, freshness histograms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpu_trainer.prequential import auc
from gpu_trainer.scoring import load_snapshot
from gpu_trainer.snapshots import SnapshotStore


def frozen_auc(snapshots: SnapshotStore, version: int, samples: list[dict]) -> list[tuple[int, float]]:
    """AUC over time of the first promoted snapshot, never updated, on the samples after it."""
    frozen = load_snapshot(snapshots, version)
    later = [r for r in samples if r["event_time"] > frozen.manifest.newest_event_ms]
    if not later:
        return []
    probs = frozen.score_samples(later)
    times = np.array([r["event_time"] for r in later])
    labels = np.array([r["label"] for r in later])
    edges = np.linspace(times.min(), times.max() + 1, 11)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        mask = (times >= lo) & (times < hi)
        value = auc(probs[mask].astype(np.float64), labels[mask]) if mask.sum() > 50 else None
        if value is not None:
            out.append((int(hi), value))
    return out


def demo_plots(auc_history: list[dict[str, Any]], frozen: list[tuple[int, float]], feature_latency_ms: list[int],
               out_dir: Path) -> list[Path]:
    """`auc_over_time.png` (real-time prequential AUC beside the frozen snapshot's) and
    `feature_freshness.png` (window end -> readable in Redis) in `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(8, 4))
    points = [(h["at_ms"], h["auc"]) for h in auc_history if h["auc"] is not None and h["at_ms"]]
    if points:
        # batches may end at slightly earlier event times than their predecessors: plot the running max
        times = np.maximum.accumulate([t for t, _ in points])
        points = list(zip(times.tolist(), [a for _, a in points], strict=True))
        t0 = points[0][0]
        ax.plot([(t - t0) / 1000 for t, _ in points], [a for _, a in points], label="real-time (prequential)")
        if frozen:
            ax.plot([(t - t0) / 1000 for t, _ in frozen], [a for _, a in frozen], "o--",
                    label="frozen first snapshot")
    ax.set_xlabel("event time since the first sample (s)")
    ax.set_ylabel("AUC")
    ax.set_title("Prequential AUC (rolling window): real-time model vs frozen first snapshot")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "auc_over_time.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    lat = np.array(feature_latency_ms) / 1000.0
    if len(lat):
        ax.hist(lat, bins=50)
        ax.set_title(f"Feature freshness: window end -> readable in Redis (p50 {np.median(lat):.2f}s, "
                     f"p99 {np.percentile(lat, 99):.2f}s)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("feature records")
    fig.tight_layout()
    paths.append(out_dir / "feature_freshness.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
