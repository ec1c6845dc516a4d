"""`rtrec evaluate`: replay a real log through the real pipeline, then compare training strategies.

The log is replayed into a fresh topic namespace, the feature job runs bounded over it (so the
samples carry the same point-in-time features and labels as in production), and the samples are
then scored in event-time order by:

- frozen: trained on the first `train_fraction` of the samples, never updated;
- periodic: retrained from scratch every `period_s` of event time on everything seen so far;
- real-time: incremental (test-then-train), plain / with EMA / with EWC / with both.

Every strategy is scored on the same samples (those after the first part), each before it learns
from them, so the AUC and logloss figures are comparable. The report gives each AUC a 95 % bootstrap
interval and each strategy's AUC difference from the frozen model a paired one (the same resampled
samples for every strategy), so a difference is only read as one when its interval excludes zero.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.kafka import ensure_topics
from core.log_range import LogRange
from core.settings import Settings, TrainerSettings
from gpu_trainer.batch import Columns
from gpu_trainer.learner import Learner
from gpu_trainer.prequential import auc, logloss
from gpu_trainer.shadow import ShadowGate
from rtrec.backfill import range_offsets
from rtrec.job_progress import wait_reporting_reads
from rtrec.sources.produce import produce_replay, produce_synthetic
from rtrec.sources.replay import ColumnMapping
from schemas.kafka_io import read_topic


@dataclass
class StrategyResult:
    name: str
    probs: np.ndarray
    labels: np.ndarray
    times: np.ndarray
    samples_per_s: float | None = None  # streaming phase (score, then learn), where it is one

    @property
    def auc(self) -> float | None:
        return auc(self.probs, self.labels)

    @property
    def logloss(self) -> float:
        return logloss(self.probs, self.labels)


def pipeline_samples(settings: Settings, paths: Sequence[Path], mapping: ColumnMapping, say: Callable[[str], None],
                     items_by_file: bool = False) -> list[dict]:
    """Replays the logs into fresh topics, runs the feature job bounded over them, returns the samples."""

    def replay(s: Settings) -> None:
        summary = produce_replay(s, paths, mapping, progress=True, report=say, items_by_file=items_by_file)
        say(f"[evaluate] replayed {summary.produced} events ({summary.rejected} rows rejected)")

    return _through_pipeline(settings, replay, say)


def synthetic_samples(settings: Settings, n_events: int, hours: float, say: Callable[[str], None]) -> list[dict]:
    """The same, for `n_events` of the synthetic generator spread over `hours` of event time (its
    users' tastes drift with event time, so this is where frozen and real-time models part)."""

    def generate(s: Settings) -> None:
        # the rate counts impressions; clicks and likes come on top, so aim it a little low
        per_second = n_events / (hours * 3600) / 1.25
        s = s.model_copy(update={"synthetic": s.synthetic.model_copy(update={"events_per_second_event_time":
                                                                            per_second})})
        summary = produce_synthetic(s, n_events, start_ms=SYNTHETIC_START_MS, progress=True)
        say(f"[evaluate] generated {summary.produced} synthetic events")

    return _through_pipeline(settings, generate, say)


SYNTHETIC_START_MS = 1_700_000_000_000  # fixed, so a run is repeatable


def _through_pipeline(settings: Settings, produce: Callable[[Settings], None],
                      say: Callable[[str], None]) -> list[dict]:
    from flink_jobs.runner import start_job

    run = f"eval-{uuid.uuid4().hex[:8]}"
    s = settings.namespaced(run)
    topics = s.kafka.topics
    ensure_topics(s.kafka.bootstrap_servers, list(topics.model_dump().values()), s.kafka.partitions,
                  security=s.kafka.security.librdkafka(), per_topic=s.kafka.partitions_of())
    produce(s)
    say("[evaluate] running the feature job over them")
    offsets = range_offsets(s.kafka.bootstrap_servers, topics.events, LogRange(),
                            security=s.kafka.security.librdkafka())
    wait_reporting_reads(start_job(s, resume=False, log_range=LogRange(), job_id=run), s, offsets, say, "evaluate")
    samples = read_topic(s.kafka.bootstrap_servers, topics.samples, "TrainingSample", timeout_s=120,
                         security=s.kafka.security.librdkafka()).records
    samples.sort(key=lambda r: (r["event_time"], r["sample_id"]))
    dead = read_topic(s.kafka.bootstrap_servers, topics.dead_letter, "DeadLetter", timeout_s=60,
                      security=s.kafka.security.librdkafka()).records
    say(f"[evaluate] {len(samples)} samples, {np.mean([r['label'] for r in samples]):.3%} positive; "
        f"{len(dead)} dead letters in {topics.dead_letter}")
    return samples


def _batches(columns: Columns, size: int) -> list[Columns]:
    return [columns.select(np.arange(len(columns))[i:i + size]) for i in range(0, len(columns), size)]


def _predict(learner: Learner, columns: Columns) -> np.ndarray:
    return learner.predict(columns.to_batch(learner.cfg.user_buckets, learner.cfg.item_buckets))


def _fit(cfg: TrainerSettings, columns: Columns, epochs: int, batch: int) -> Learner:
    learner = Learner(cfg, columns.features.shape[1])
    for _ in range(epochs):
        for part in _batches(columns, batch):
            learner.step(part.to_batch(cfg.user_buckets, cfg.item_buckets))
    return learner


def _item_ctr(head: Columns, tail: Columns, prior: float = 20.0) -> np.ndarray:
    """A sanity baseline without a model: each item's click rate in the first part, shrunk towards
    the overall rate by `prior` impressions. When even this cannot rank the rest, the log holds
    little item-level signal for any strategy to find."""
    base = float(head.label.mean())
    clicks: dict[str, float] = {}
    shown: dict[str, int] = {}
    for item, label in zip(head.item_id, head.label, strict=True):
        clicks[item] = clicks.get(item, 0.0) + float(label)
        shown[item] = shown.get(item, 0) + 1
    return np.array([(clicks.get(i, 0.0) + prior * base) / (shown.get(i, 0) + prior) for i in tail.item_id])


def compare(samples: list[dict], cfg: TrainerSettings, train_fraction: float, period_s: float, batch: int = 256,
            epochs: int = 3, ewc_lambdas: Sequence[float] = (), peer: str | None = None,
            say: Callable[[str], None] = lambda _: None, history_length: int = 0) -> list[StrategyResult]:
    """Frozen, periodic, then the real-time variants; EWC runs once per λ in `ewc_lambdas`
    (default: the configured one); with `history_length`, frozen and real-time plain once more with a
    model reading that many of each sample's recent items (when `cfg` reads none); with
    `peer="river"`, River's FMClassifier last. `say` hears of each strategy as it finishes, and of
    each periodic refit."""
    began = time.perf_counter()

    def done(result: StrategyResult) -> StrategyResult:
        value = "n/a" if result.auc is None else f"{result.auc:.4f}"
        say(f"[evaluate] {result.name}: AUC {value} ({time.perf_counter() - began:.0f} s in all)")
        return result

    columns = Columns.from_records(samples, history_length=max(history_length, cfg.history_length))
    cut = int(len(columns) * train_fraction)
    head, tail = columns.select(np.arange(cut)), columns.select(np.arange(cut, len(columns)))
    results = [done(StrategyResult("frozen (first part)", _predict(_fit(cfg, head, epochs, batch), tail),
                                   tail.label, tail.event_time_ms))]

    results.append(done(StrategyResult("item CTR of the first part (counts)", _item_ctr(head, tail), tail.label,
                                       tail.event_time_ms)))

    probs = []
    period_ms = int(period_s * 1000)
    start = int(tail.event_time_ms.min())
    edges = range(start, int(tail.event_time_ms.max()) + period_ms, period_ms)
    for k, lo in enumerate(edges):
        part = tail.select((tail.event_time_ms >= lo) & (tail.event_time_ms < lo + period_ms))
        if not len(part):
            continue
        seen = columns.select(columns.event_time_ms < lo)
        probs.append(_predict(_fit(cfg, seen, epochs, batch), part))
        say(f"[evaluate] periodic refit {k + 1}/{len(edges)} on {len(seen)} samples "
            f"({time.perf_counter() - began:.0f} s in all)")
    results.append(done(StrategyResult(f"periodic (every {period_s / 3600:g} h)", np.concatenate(probs),
                                       tail.label, tail.event_time_ms)))

    lambdas = list(ewc_lambdas) or [cfg.ewc_lambda]
    variants = [("real-time plain", False, False, cfg.ewc_lambda), ("real-time + EMA", True, False, cfg.ewc_lambda)]
    for lam in lambdas:
        variants += [(f"real-time + EWC (λ={lam:g})", False, True, lam),
                     (f"real-time + EMA + EWC (λ={lam:g})", True, True, lam)]
    per_batch: dict[str, list[np.ndarray]] = {}
    seconds = 0.0
    for name, ema, ewc, lam in variants:
        variant = cfg.model_copy(update={"ema_enabled": ema, "ewc_enabled": ewc, "ewc_lambda": lam})
        learner = _fit(variant, head, epochs, batch)
        out = per_batch[name] = []
        started = time.perf_counter()
        for k, part in enumerate(_batches(tail, batch)):
            out.append(_predict(learner, part))
            learner.step(part.to_batch(variant.user_buckets, variant.item_buckets))
            if ewc and k % 20 == 19:
                learner.consolidate()
        took = time.perf_counter() - started
        seconds += took
        results.append(done(StrategyResult(name, np.concatenate(out), tail.label, tail.event_time_ms,
                                           len(tail) / max(took, 1e-9))))
    results.append(done(_auto(per_batch, _batches(tail, batch), tail, seconds)))
    if history_length and not cfg.history_length:
        # the configured model mean-pooling the recent items, then din attending over them (with types, ages)
        for model, label in ((cfg.model, "+ recent items"), ("din", "din (attention over recent items)")):
            reading = cfg.model_copy(update={"model": model, "history_length": history_length, "ema_enabled": False,
                                             "ewc_enabled": False})
            results.append(done(StrategyResult(f"frozen {label} (H={history_length})",
                                               _predict(_fit(reading, head, epochs, batch), tail), tail.label,
                                               tail.event_time_ms)))
            results.append(done(_real_time(f"real-time plain {label} (H={history_length})", reading,
                                           _fit(reading, head, epochs, batch), tail, batch)))
    if peer == "river":
        from rtrec.peer_baseline import river_fm

        probs, rate = river_fm(head, tail, epochs)
        results.append(done(StrategyResult("River FMClassifier (k=10), same protocol", probs, tail.label,
                                           tail.event_time_ms, rate)))
    return results


def _real_time(name: str, cfg: TrainerSettings, learner: Learner, tail: Columns, batch: int) -> StrategyResult:
    """`learner` scores each batch of `tail`, then learns from it."""
    out = []
    started = time.perf_counter()
    for part in _batches(tail, batch):
        out.append(_predict(learner, part))
        learner.step(part.to_batch(cfg.user_buckets, cfg.item_buckets))
    took = time.perf_counter() - started
    return StrategyResult(name, np.concatenate(out), tail.label, tail.event_time_ms, len(tail) / max(took, 1e-9))


def _auto(per_batch: dict[str, list[np.ndarray]], parts: list[Columns], tail: Columns,
          seconds: float) -> StrategyResult:
    """The shadow learners' choice: every variant learns every batch, and each batch is served by the
    variant the gate chose from the batches before it (each variant's scores were made before it learned
    that batch, so replaying them through the gate here is exactly what a live trainer would serve).
    Its samples/s are those of running all the variants."""
    gate = ShadowGate(list(per_batch), window=5_000, margin=0.01)
    served = []
    for k, part in enumerate(parts):
        served.append(per_batch[gate.leader][k])
        gate.update({name: out[k] for name, out in per_batch.items()}, part.label)
    name = f"auto (shadow learners: {len(per_batch)} variants, {len(gate.switches)} switches, last {gate.leader})"
    return StrategyResult(name, np.concatenate(served), tail.label, tail.event_time_ms,
                          len(tail) / max(seconds, 1e-9))


@dataclass(frozen=True)
class Intervals:
    """95 % bootstrap intervals per strategy: of its AUC, and of its AUC minus the first strategy's."""

    auc: np.ndarray  # [strategy, 2]
    delta: np.ndarray  # [strategy, 2]


def bootstrap(results: Sequence[StrategyResult], resamples: int = 300, seed: int = 0) -> Intervals:
    """Paired: each resample draws the same samples (with replacement) for every strategy.

    >>> y = np.array([0, 1] * 200); good = StrategyResult("a", y + 0.1, y, y)
    >>> bad = StrategyResult("b", np.random.default_rng(1).random(400), y, y)
    >>> iv = bootstrap([bad, good], resamples=50)
    >>> bool(iv.auc[1, 0] == 1.0 and iv.delta[1, 0] > 0.3 and iv.delta[0, 0] == 0.0)
    True
    """
    rng = np.random.default_rng(seed)
    n = len(results[0].labels)
    aucs = np.full((len(results), resamples), np.nan)
    for b in range(resamples):
        idx = rng.integers(0, n, n)
        for i, r in enumerate(results):
            value = auc(r.probs[idx], r.labels[idx])
            aucs[i, b] = np.nan if value is None else value
    percentiles = [2.5, 97.5]
    return Intervals(np.nanpercentile(aucs, percentiles, axis=1).T,
                     np.nanpercentile(aucs - aucs[0], percentiles, axis=1).T)


def write_report(results: list[StrategyResult], out_dir: Path) -> tuple[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    iv = bootstrap(results)
    first = results[0].name
    lines = [f"| strategy | AUC | 95 % CI | AUC - {first} (95 % CI) | logloss | samples | positives | samples/s |",
             "|---|---|---|---|---|---|---|---|"]
    base = results[0].auc
    for i, r in enumerate(results):
        value = r.auc
        rate = "" if r.samples_per_s is None else f"{r.samples_per_s:,.0f}"
        if value is None or base is None:  # one class only: no AUC to compare
            lines.append(f"| {r.name} | n/a | | | {r.logloss:.4f} | {len(r.labels)} | {int(r.labels.sum())} | {rate} |")
            continue
        delta = "" if i == 0 else f"{value - base:+.4f} [{iv.delta[i, 0]:+.4f}, {iv.delta[i, 1]:+.4f}]"
        lines.append(f"| {r.name} | {value:.4f} | [{iv.auc[i, 0]:.4f}, {iv.auc[i, 1]:.4f}] | {delta} | "
                     f"{r.logloss:.4f} | {len(r.labels)} | {int(r.labels.sum())} | {rate} |")
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
