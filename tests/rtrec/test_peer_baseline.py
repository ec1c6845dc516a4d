"""`rtrec evaluate --peer river`: River's FMClassifier on the same samples, in the same order, scored
before it learns each one, with its samples/s beside ours (a pure unit test: samples built here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from core.settings import TrainerSettings
from rtrec.evaluation import compare, write_report
from schemas.feature_set import FEATURE_NAMES

pytest.importorskip("river")


def samples(n: int = 1500, seed: int = 3) -> list[dict]:
    """Items i0 and i1 are clicked far more often than the others: any learner worth its name ranks them."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        item = f"i{rng.integers(8)}"
        label = int(rng.random() < (0.5 if item in ("i0", "i1") else 0.05))
        out.append({"sample_id": f"s{k}", "user_id": f"u{rng.integers(40)}", "item_id": item,
                    "features": [float(rng.poisson(2)) for _ in FEATURE_NAMES], "label": label,
                    "event_time": 1_700_000_000_000 + 1000 * k, "feature_set": "v1"})
    return out


def test_river_scores_the_same_samples_before_learning_them_and_reports_its_rate(tmp_path: Path) -> None:
    cfg = TrainerSettings().model_copy(update={"user_buckets": 1 << 10, "item_buckets": 1 << 8})
    results = compare(samples(), cfg, train_fraction=0.3, period_s=10 * 3600, peer="river")
    river, ours = results[-1], next(r for r in results if r.name == "real-time plain")
    assert river.name == "River FMClassifier (k=10), same protocol"
    assert np.array_equal(river.labels, results[0].labels) and np.array_equal(river.times, results[0].times)
    assert len(river.probs) == 1050 and np.isfinite(river.probs).all()
    assert river.auc is not None and river.auc > 0.65  # it learned the two popular items (chance: 0.5)
    assert river.samples_per_s and ours.samples_per_s and river.samples_per_s > 0
    table, _ = write_report(results, tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| River"))
    assert row.rstrip(" |").split("|")[-1].strip().replace(",", "").isdigit()


def test_peer_river_is_offered_by_the_cli() -> None:
    from rtrec.cli.main import cli

    result = CliRunner().invoke(cli, ["evaluate", "--help"])
    assert "--peer [river]" in result.output
