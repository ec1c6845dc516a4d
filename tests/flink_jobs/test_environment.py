"""flink.config reaches the job: applied after the project's own options, so a user's entry wins; a
checkpoint of another plan is refused with its cause."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.settings import Settings
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import build_job
from flink_jobs.runner import IncompatibleCheckpoint, latest_checkpoint, start_job
from rtrec.cli.features import features_group
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, running_job

pytestmark = pytest.mark.integration


def test_flink_config_overrides_the_projects_options_and_changes_the_plan(settings: Settings) -> None:
    plain = build_job(settings, table_environment(settings)).explain()
    assert "MiniBatchAssigner" not in plain
    tuned = settings.model_copy(update={"flink": settings.flink.model_copy(update={"config": {
        "table.exec.mini-batch.enabled": "true", "table.exec.mini-batch.allow-latency": "100 ms",
        "table.exec.mini-batch.size": "1000", "pipeline.name": "my-features"}})})
    t_env = table_environment(tuned)
    assert t_env.get_config().get("pipeline.name", None) == "my-features"
    assert "MiniBatchAssigner" in build_job(tuned, t_env).explain()


def test_the_windows_aggregate_in_one_phase_unless_flink_config_says_otherwise(settings: Settings) -> None:
    """The keyed windows get no local pre-aggregation by default (README: it only copied rows here)."""
    plain = build_job(settings, table_environment(settings)).explain()
    assert "WindowAggregate" in plain and "LocalWindowAggregate" not in plain
    auto = settings.model_copy(update={"flink": settings.flink.model_copy(update={"config": {
        "table.optimizer.agg-phase-strategy": "AUTO"}})})
    assert "LocalWindowAggregate" in build_job(auto, table_environment(auto)).explain()


def test_the_base_window_and_the_tiles_of_its_length_share_one_aggregation(settings: Settings) -> None:
    """Per user and item: one aggregation for the 3 s window and the 60 s horizon's 3 s tiles, one for
    the 600 s horizon's 30 s tiles; the pairs' one makes five. The shared one writes one record, which
    lists the horizon it is a tile of: no row per horizon (an UNNEST), no regular join (which would
    keep every window's row in state)."""
    plan = build_job(settings, table_environment(settings), with_samples=False).explain()
    optimized = plan.split("== Optimized Execution Plan ==")[1]
    assert optimized.count("WindowAggregate(") == 5
    assert "Correlate(" not in optimized and "Join(" not in optimized


def test_the_samples_windows_close_half_a_base_window_after_the_features(settings: Settings) -> None:
    """The samples' source trails the features' by one base window (what the features count is never
    behind it) and half a window more, so the two sets of windows close at different moments."""
    plan = build_job(settings, table_environment(settings)).explain()
    optimized = plan.split("== Optimized Execution Plan ==")[1]
    delays = dict(re.findall(r"TableSourceScan\(table=\[\[default_catalog, default_database, (\w+),"
                             r".*?watermark=\[-\(.*?, (\d+):INTERVAL SECOND\(\d\)\)\]", optimized))
    assert delays == {"events_raw": str(settings.flink.watermark_delay_ms),
                      "sample_events_raw": str(settings.flink.watermark_delay_ms + 4500)}
    held_back = int(delays["sample_events_raw"]) - int(delays["events_raw"])
    assert held_back >= settings.flink.window_s * 1000 and held_back % (settings.flink.window_s * 1000) != 0


def test_a_checkpoint_of_another_plan_ends_the_start_with_its_cause(settings: Settings, tmp_path: Path) -> None:
    """A checkpoint of the two-phase plan (an earlier build's) does not restore into the one-phase plan:
    the start fails with what to do, and `features run` exits 1 with it, no traceback."""
    s = job_settings(settings, checkpoint_dir=tmp_path)
    create_topics(s)
    produce(s, [event("a", "impression", "u1", "i1", 100), event("b", "click", "u1", "i1", 200)])
    two_phase = s.model_copy(update={"flink": s.flink.model_copy(update={"config": {
        "table.optimizer.agg-phase-strategy": "AUTO"}})})
    with running_job(two_phase):
        deadline = time.monotonic() + 60
        while latest_checkpoint(tmp_path) is None and time.monotonic() < deadline:
            time.sleep(0.5)
    assert latest_checkpoint(tmp_path) is not None
    with pytest.raises(IncompatibleCheckpoint, match="--fresh"):
        start_job(s, resume=True)
    ran = CliRunner().invoke(features_group, ["run", "--no-loader"], obj=s)
    assert ran.exit_code == 1 and "another shape" in ran.output and "Traceback" not in ran.output
