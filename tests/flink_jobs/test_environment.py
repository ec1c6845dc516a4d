"""flink.config reaches the job: applied after the project's own options, so a user's entry wins; the
job's shape; a checkpoint of another plan is refused with its cause."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.settings import Settings
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import build_job, job_graph
from flink_jobs.runner import IncompatibleCheckpoint, latest_checkpoint, start_job
from rtrec.cli.features import features_group
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, running_job

pytestmark = pytest.mark.integration


def test_flink_config_overrides_the_projects_options_and_changes_the_plan(settings: Settings) -> None:
    def source(s: Settings) -> str:
        t_env = table_environment(s)
        return next(n["contents"] for n in job_graph(build_job(s, t_env)) if n["pact"] == "Data Source")

    assert f"idletimeout=[{settings.flink.idle_timeout_ms}]" in source(settings)
    tuned = settings.model_copy(update={"flink": settings.flink.model_copy(update={"config": {
        "table.exec.source.idle-timeout": "12345 ms", "pipeline.name": "my-features"}})})
    assert table_environment(tuned).get_config().get("pipeline.name", None) == "my-features"
    assert "idletimeout=[12345]" in source(tuned)


def test_the_windows_and_samples_are_two_keyed_operators_between_one_source_and_the_sinks(
        settings: Settings) -> None:
    """No SQL window, join or aggregate is left: the items' operator, then the users', both keyed."""
    nodes = job_graph(build_job(settings, table_environment(settings)))
    contents = [n["contents"] for n in nodes]
    assert "items" in contents and "users" in contents
    assert not any(word in c for c in contents for word in ("Window", "Join", "Aggregate", "OverAggregate"))
    keyed = {n["contents"]: [p["ship_strategy"] for p in n.get("predecessors", [])] for n in nodes}
    assert keyed["items"] == ["HASH"] and keyed["users"] == ["HASH"]


def test_a_checkpoint_of_another_plan_ends_the_start_with_its_cause(settings: Settings, tmp_path: Path) -> None:
    """A checkpoint of other horizons does not restore into this job (its operators' state is laid out
    by them): the start fails with what to do, and `features run` exits 1 with it, no traceback."""
    s = job_settings(settings, checkpoint_dir=tmp_path)
    create_topics(s)
    produce(s, [event("a", "impression", "u1", "i1", 100), event("b", "click", "u1", "i1", 200)])
    other = s.model_copy(update={"flink": s.flink.model_copy(update={"horizons_s": (9,)})})
    with running_job(other):
        deadline = time.monotonic() + 60
        while latest_checkpoint(tmp_path) is None and time.monotonic() < deadline:
            time.sleep(0.5)
    assert latest_checkpoint(tmp_path) is not None
    with pytest.raises(IncompatibleCheckpoint, match="--fresh"):
        start_job(s, resume=True)
    ran = CliRunner().invoke(features_group, ["run", "--no-loader"], obj=s)
    assert ran.exit_code == 1 and "another shape" in ran.output and "Traceback" not in ran.output
