"""flink.config reaches the job: applied after the project's own options, so a user's entry wins."""

from __future__ import annotations

import pytest

from core.settings import Settings
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import build_job

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
