"""`rtrec evaluate`: replay a real log through the real pipeline, then compare training strategies.

The log is replayed into a fresh topic namespace, the feature job runs bounded over it (so the
samples carry the same point-in-time features and labels as in production), and the samples are
then scored in event-time order by:

- frozen: trained on the first `train_fraction` of the samples, never updated;
- periodic: retrained from scratch every `period_s` of event time on everything seen so far;
- real-time: incremental (test-then-train), plain / with EMA / with EWC / with both.

Every strategy is scored on the same samples (those after the first part), each before it learns
from them, so the AUC and logloss figures are comparable.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpu_trainer.batch import Columns
from gpu_trainer.learner import Learner
from gpu_trainer.metrics import auc, logloss
from gpu_trainer.models import build_model
from rtrec.settings import Settings, TrainerSettings
from rtrec.sources.produce import produce_replay
from rtrec.sources.replay import ColumnMapping
from schemas.kafka_io import ensure_topics, read_topic


@dataclass
class StrategyResult:
    name: str
    probs: np.ndarray
    labels: np.ndarray
    times: np.ndarray

    @property
    def auc(self) -> float | None:
        return auc(self.probs, self.labels)

    @property
    def logloss(self) -> float:
        return logloss(self.probs, self.labels)


def pipeline_samples(settings: Settings, path: Path, mapping: ColumnMapping, say: Callable[[str], None]) -> list[dict]:
    """Replays the log into fresh topics, runs the feature job bounded over them, returns the samples."""
    from flink_jobs.runner import start_job

    run = uuid.uuid4().hex[:8]
    topics = settings.kafka.topics.under(f"rtrec.eval.{run}.")
    s = settings.model_copy(update={
        "kafka": settings.kafka.model_copy(update={"topics": topics}),
        "flink": settings.flink.model_copy(update={"group_id": f"rtrec-eval-{run}",
                                                   "checkpoint_dir": settings.flink.checkpoint_dir / f"eval-{run}"})})
    ensure_topics(s.kafka.bootstrap_servers, list(topics.model_dump().values()), s.kafka.partitions)
    summary = produce_replay(s, path, mapping, progress=True, report=say)
    say(f"[evaluate] replayed {summary.produced} events ({summary.rejected} rows rejected); running the feature job")
    start_job(s, resume=False, startup={"scan.startup.mode": "earliest-offset", "scan.bounded.mode": "latest-offset"},
              job_id=f"eval-{run}").wait()
    samples = read_topic(s.kafka.bootstrap_servers, topics.samples, "TrainingSample", timeout_s=120).records
    samples.sort(key=lambda r: (r["event_time"], r["sample_id"]))
    say(f"[evaluate] {len(samples)} samples, {np.mean([r['label'] for r in samples]):.3%} positive")
    return samples


def _batches(columns: Columns, size: int) -> list[Columns]:
    return [columns.select(np.arange(len(columns))[i:i + size]) for i in range(0, len(columns), size)]


def _predict(learner: Learner, columns: Columns) -> np.ndarray:
    model = build_model(learner.model_name, learner.config)
    model.load_state_dict(learner.published_state())
    b = columns.to_batch(learner.cfg.user_buckets, learner.cfg.item_buckets)
    with torch.no_grad():
        return torch.sigmoid(model(b.user_idx, b.item_idx, b.dense)).numpy().astype(np.float64)


def _fit(cfg: TrainerSettings, columns: Columns, epochs: int, batch: int) -> Learner:
    learner = Learner(cfg, columns.features.shape[1])
    for _ in range(epochs):
        for part in _batches(columns, batch):
            learner.step(part.to_batch(cfg.user_buckets, cfg.item_buckets))
    return learner


def compare(samples: list[dict], cfg: TrainerSettings, train_fraction: float, period_s: float, batch: int = 256,
            epochs: int = 3) -> list[StrategyResult]:
    columns = Columns.from_records(samples)
    cut = int(len(columns) * train_fraction)
    head, tail = columns.select(np.arange(cut)), columns.select(np.arange(cut, len(columns)))
    results = [StrategyResult("frozen (first part)", _predict(_fit(cfg, head, epochs, batch), tail), tail.label,
                              tail.event_time_ms)]

    probs = []
    period_ms = int(period_s * 1000)
    start = int(tail.event_time_ms.min())
    edges = range(start, int(tail.event_time_ms.max()) + period_ms, period_ms)
    for lo in edges:
        part = tail.select((tail.event_time_ms >= lo) & (tail.event_time_ms < lo + period_ms))
        if not len(part):
            continue
        seen = columns.select(columns.event_time_ms < lo)
        probs.append(_predict(_fit(cfg, seen, epochs, batch), part))
    results.append(StrategyResult(f"periodic (every {period_s / 3600:g} h)", np.concatenate(probs), tail.label,
                                  tail.event_time_ms))

    for name, ema, ewc in [("real-time plain", False, False), ("real-time + EMA", True, False),
                           ("real-time + EWC", False, True), ("real-time + EMA + EWC", True, True)]:
        variant = cfg.model_copy(update={"ema_enabled": ema, "ewc_enabled": ewc})
        learner = _fit(variant, head, epochs, batch)
        out = []
        for k, part in enumerate(_batches(tail, batch)):
            out.append(_predict(learner, part))
            learner.step(part.to_batch(variant.user_buckets, variant.item_buckets))
            if ewc and k % 20 == 19:
                learner.consolidate()
        results.append(StrategyResult(name, np.concatenate(out), tail.label, tail.event_time_ms))
    return results


def write_report(results: list[StrategyResult], out_dir: Path) -> tuple[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["| strategy | AUC | logloss | samples |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.name} | {r.auc:.4f} | {r.logloss:.4f} | {len(r.labels)} |")
    table = "\n".join(lines)
    (out_dir / "evaluation.md").write_text(table + "\n")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    times = results[0].times
    edges = np.quantile(times, np.linspace(0, 1, 11))
    for r in results:
        points = []
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            mask = (r.times >= lo) & (r.times <= hi)
            value = auc(r.probs[mask], r.labels[mask]) if mask.sum() >= 30 else None
            if value is not None:
                points.append(((hi - times.min()) / 3_600_000, value))
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=r.name)
    ax.set_xlabel("event time since the evaluation start (h)")
    ax.set_ylabel("AUC per time bucket")
    ax.set_title("Prequential AUC by strategy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "evaluation_auc.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return table, path
