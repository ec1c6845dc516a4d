"""`rtrec evaluate` end to end on two real Open Bandit campaigns (tests/data/obd): replayed merged
through the feature job into samples, then every strategy scored and reported with intervals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.settings import Settings
from rtrec.evaluation import compare, pipeline_samples, write_report
from rtrec.sources.replay import ColumnMapping

pytestmark = pytest.mark.integration

OBD = Path(__file__).parents[1] / "data" / "obd"
MAPPING = ColumnMapping(user="user_feature_0+user_feature_1+user_feature_2+user_feature_3", item="item_id",
                        time="timestamp", click="click", position="position")


def test_two_campaigns_through_the_pipeline_and_every_strategy(settings: Settings, tmp_path: Path) -> None:
    said: list[str] = []
    samples = pipeline_samples(settings, [OBD / "men.csv", OBD / "women.csv"], MAPPING, said.append,
                               items_by_file=True)
    assert any("replayed 2007 events (0 rows rejected)" in line for line in said), said  # 2000 rows, 7 clicks
    assert any("0 dead letters" in line for line in said), said
    assert len(samples) == 2000 and sum(s["label"] for s in samples) == 7  # one sample per impression
    assert {s["item_id"].split(":")[0] for s in samples} == {"men", "women"}  # item 0 of each is a different item
    times = [s["event_time"] for s in samples]
    assert times == sorted(times)

    cfg = settings.trainer.model_copy(update={"user_buckets": 1 << 12, "item_buckets": 1 << 8})
    results = compare(samples, cfg, train_fraction=0.3, period_s=3 * 3600, ewc_lambdas=(1.0, 10.0))
    assert [r.name for r in results][:-1] == [
        "frozen (first part)", "item CTR of the first part (counts)", "periodic (every 3 h)", "real-time plain",
        "real-time + EMA",
        "real-time + EWC (λ=1)", "real-time + EMA + EWC (λ=1)", "real-time + EWC (λ=10)",
        "real-time + EMA + EWC (λ=10)"]
    assert results[-1].name.startswith("auto (shadow learners: 6 variants, ")
    for r in results:
        assert len(r.probs) == 1400 and np.isfinite(r.probs).all() and ((r.probs > 0) & (r.probs < 1)).all()
        assert np.array_equal(r.labels, results[0].labels)  # every strategy scored on the same samples

    table, plot = write_report(results, tmp_path)
    rows = table.splitlines()[2:]
    assert len(rows) == len(results) and plot.is_file() and (tmp_path / "evaluation.md").read_text().strip() == table
    assert all(row.count("|") == 9 for row in rows)


def test_evaluate_needs_exactly_one_source() -> None:
    from click.testing import CliRunner

    from rtrec.cli.main import cli

    for args in ([], ["--data", str(OBD / "men.csv"), "--synthetic-events", "10"]):
        result = CliRunner().invoke(cli, ["evaluate", *args])
        assert result.exit_code == 2 and "either --data (once or more) or --synthetic-events" in result.output
