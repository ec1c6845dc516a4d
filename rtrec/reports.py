"""Figures of a run that a person would rather see than read: AUC over time, freshness histograms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpu_trainer.batch import hash_ids
from gpu_trainer.prequential import auc
from gpu_trainer.scoring import load_snapshot
from gpu_trainer.snapshots import SnapshotStore


@dataclass(frozen=True)
class Freshness:
    """Window close (its end plus the watermark delay, when the watermark lets it close) -> readable in
    Redis, in ms per feature record, apart for the windows' aggregates and for the users' recent lists
    (horizon 0), which close with their base window like the rest. With the times the
    loader had each record (fetched and decoded), the windows' close -> the loader too: the job's and
    Kafka's part of the latency, the rest being the loader's writes.

    >>> f = Freshness.of([2500, 2600, 5900], [3, 60, 0], watermark_delay_ms=2000, received_ms=[2300, 2450, 5000])
    >>> f.windows_ms.tolist(), f.recent_lists_ms.tolist(), f.windows_at_loader_ms.tolist()
    ([500, 600], [3900], [300, 450])
    >>> f.at_loader_lines()
    ['windows p50 0.38s p99 0.45s (2 records)']
    """

    windows_ms: np.ndarray
    recent_lists_ms: np.ndarray
    windows_at_loader_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def of(cls, latencies_ms: Sequence[int], horizons_s: Sequence[int], watermark_delay_ms: int,
           received_ms: Sequence[int] = ()) -> Freshness:
        close = np.asarray(latencies_ms, dtype=np.int64) - watermark_delay_ms
        lists = np.asarray(horizons_s, dtype=np.int64) == 0
        at_loader = np.asarray(received_ms, dtype=np.int64) - watermark_delay_ms
        return cls(close[~lists], close[lists], at_loader[~lists] if len(at_loader) else at_loader)

    def lines(self) -> list[str]:
        return [_percentiles(name, ms) for name, ms in (("windows", self.windows_ms),
                                                        ("recent lists", self.recent_lists_ms)) if len(ms)]

    def at_loader_lines(self) -> list[str]:
        return [_percentiles("windows", self.windows_at_loader_ms)] if len(self.windows_at_loader_ms) else []


def _percentiles(name: str, ms: np.ndarray) -> str:
    return f"{name} p50 {np.median(ms) / 1000:.2f}s p99 {np.percentile(ms, 99) / 1000:.2f}s ({len(ms)} records)"


@dataclass(frozen=True)
class BucketAUC:
    """One bucket of event time: both models' AUC on the same samples (None: too few, or one class)."""

    start_ms: int
    end_ms: int
    samples: int
    realtime: float | None
    frozen: float | None


@dataclass
class Comparison:
    """The real-time model (each sample scored before it learned from it) against the first promoted
    snapshot, never updated, on the same samples: those after the snapshot that the real-time model scored."""

    frozen_version: int
    samples: int  # compared: in the topic, after the snapshot, scored by the real-time model
    unscored: int  # in the topic after the snapshot, but never reached the trainer before the run ended
    realtime_auc: float | None
    frozen_auc: float | None
    buckets: list[BucketAUC] = field(default_factory=list)


def compare_with_frozen(snapshots: SnapshotStore, version: int, samples: list[dict], scored: dict[str, np.ndarray],
                        buckets: int = 10, min_per_bucket: int = 50) -> Comparison:
    """Scores `samples` (TrainingSample records) with snapshot `version` and compares, per equal
    bucket of event time, with `scored` (a ScoreLog's arrays) on the samples both scored."""
    frozen = load_snapshot(snapshots, version)
    newest = frozen.manifest.newest_event_ms if frozen.manifest.newest_event_ms is not None else -1
    later = [r for r in samples if r["event_time"] > newest]
    order = np.argsort(scored["sample_hash"], kind="stable")
    logged = scored["sample_hash"][order]
    hashes = hash_ids([r["sample_id"] for r in later], distinct=True)
    found = np.isin(hashes, logged)
    kept = [r for r, f in zip(later, found, strict=True) if f]
    result = Comparison(version, len(kept), len(later) - len(kept), None, None)
    if not kept:
        return result
    realtime = scored["score"][order][np.searchsorted(logged, hashes[found])]
    frozen_scores = frozen.score_samples(kept).astype(np.float64)
    labels = np.array([r["label"] for r in kept], dtype=np.float64)
    times = np.array([r["event_time"] for r in kept], dtype=np.int64)
    result.realtime_auc, result.frozen_auc = auc(realtime, labels), auc(frozen_scores, labels)
    edges = np.linspace(times.min(), times.max() + 1, buckets + 1)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        mask = (times >= lo) & (times < hi)
        n = int(mask.sum())
        enough = n >= min_per_bucket
        result.buckets.append(BucketAUC(int(lo), int(hi), n, auc(realtime[mask], labels[mask]) if enough else None,
                                        auc(frozen_scores[mask], labels[mask]) if enough else None))
    return result


def demo_plots(comparison: Comparison | None, freshness: Freshness, out_dir: Path) -> list[Path]:
    """`auc_over_time.png` (the real-time model and the frozen first snapshot, per bucket of event time,
    on the same samples) and `feature_freshness.png` (window close -> readable in Redis, and -> at the
    loader where known) in `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(8, 4))
    if comparison is not None and comparison.buckets:
        t0 = comparison.buckets[0].start_ms
        xs = [((b.start_ms + b.end_ms) / 2 - t0) / 1000 for b in comparison.buckets]
        for label, values, style in (("real-time (scored before learning)", [b.realtime for b in comparison.buckets],
                                      "o-"),
                                     (f"frozen first snapshot (v{comparison.frozen_version})",
                                      [b.frozen for b in comparison.buckets], "s--")):
            ax.plot(xs, [np.nan if v is None else v for v in values], style, label=label)
        ax.set_title(f"AUC per bucket of event time, both models on the same {comparison.samples} samples")
        ax.legend()
    else:
        ax.set_title("AUC per bucket of event time: no samples after the first snapshot")
    ax.set_xlabel("event time since the first compared sample (s), bucket middle")
    ax.set_ylabel("AUC")
    fig.tight_layout()
    paths.append(out_dir / "auc_over_time.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    parts = [(name, ms / 1000.0) for name, ms in (("windows", freshness.windows_ms),
                                                    ("windows at the loader", freshness.windows_at_loader_ms),
                                                    ("recent lists", freshness.recent_lists_ms))
             if len(ms)]
    if parts:
        edges = np.histogram_bin_edges(np.concatenate([s for _, s in parts]), bins=50)
        for name, seconds in parts:
            ax.hist(seconds, bins=edges, alpha=0.6,
                    label=f"{name}: p50 {np.median(seconds):.2f}s, p99 {np.percentile(seconds, 99):.2f}s")
        ax.legend()
    ax.set_title("Feature freshness: window close (end + watermark delay) -> Redis (or the loader)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("feature records")
    fig.tight_layout()
    paths.append(out_dir / "feature_freshness.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
