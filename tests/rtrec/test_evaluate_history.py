"""`rtrec evaluate`'s recent-item rows: the configured model mean-pooling the recent items, then din
attending over them, frozen and real-time, on the same samples as every other row."""

from __future__ import annotations

import numpy as np

from core.settings import TrainerSettings
from rtrec.evaluation import compare
from tests.gpu_trainer.samples import signal_records


def test_the_recent_item_rows_and_din_reading_what_pooling_cannot() -> None:
    rng = np.random.default_rng(0)
    samples = [r for k in range(40) for r in signal_records(250, rng, k * 250, "type")]
    cfg = TrainerSettings(user_buckets=1 << 16, item_buckets=1024, embedding_dim=8, lr=0.05)
    said: list[str] = []
    results = {r.name: r for r in compare(samples, cfg, train_fraction=0.3, period_s=3600.0, history_length=5,
                                          say=said.append)}
    rows = ["frozen + recent items (H=5)", "real-time plain + recent items (H=5)",
            "frozen din (attention over recent items) (H=5)", "real-time plain din (attention over recent items) (H=5)"]
    assert list(results)[-4:] == rows
    assert all(np.array_equal(results[name].labels, results["real-time plain"].labels) for name in rows)
    assert any(line.startswith("[evaluate] real-time plain din") for line in said)
    auc = {name: results[name].auc for name in results}
    # every user is new: without the recent items nothing but item popularity ranks
    assert auc["real-time plain"] is not None and auc["real-time plain"] < 0.6, auc
    din, pooled = auc[rows[3]], auc[rows[1]]
    assert din is not None and pooled is not None and din > 0.75 and din > pooled + 0.1, auc
    assert results[rows[3]].samples_per_s
