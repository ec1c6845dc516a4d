"""Every string that reaches the job's SQL goes through `quote`: names with quotes give valid SQL that
means the same names, never a statement that breaks (or is changed) by what a setting contains."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import Settings
from flink_jobs.ddl import with_options
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import build_job, job_graph
from flink_jobs.feature_sql import dead_letters_sql

QUOTED = "ev'x"


def test_literals_in_the_sql_are_quoted() -> None:
    assert "'ev''x'" in with_options({"topic": QUOTED})
    assert "'feature-job' AS stage" in dead_letters_sql("dead_letter_rows")


@pytest.mark.integration
def test_the_whole_job_plans_with_quotes_in_every_name(settings: Settings, tmp_path: Path) -> None:
    """Planning parses every statement; Kafka is not contacted (so the names need not be valid topics)."""
    k, f = settings.kafka, settings.flink
    topics = k.topics.model_copy(update={role: f"{name}'{role}" for role, name in k.topics.model_dump().items()})
    s = settings.model_copy(update={
        "kafka": k.model_copy(update={"topics": topics, "bootstrap_servers": "host'1:9092"}),
        "flink": f.model_copy(update={"group_id": "group'1", "loader_group_id": "loader'1",
                                      "checkpoint_dir": tmp_path / "checkpoints", "log_dir": tmp_path / "logs"}),
    })
    nodes = job_graph(build_job(s, table_environment(s), job_id="job'1"))
    contents = " ".join(n["contents"] for n in nodes)
    assert "events_raw" in contents and "features_sink" in contents and "samples_sink" in contents
    assert "dead_letter_sink" in contents
