"""The same job file submitted to a standalone cluster (started from the pip package's bin/ scripts)
gives the same output as the embedded run."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from core.settings import Settings
from flink_jobs.submit import job_running
from rtrec.services.flink_cluster import FlinkCluster
from schemas.kafka_io import ConsumedBatch
from tests.flink_jobs.harness import as_row, create_topics, event, job_settings, produce, running_job, wait_for
from tests.infra import free_port, local_services_settings

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]

EVENTS = [event("e1", "impression", "u1", "i1", 100), event("e2", "click", "u1", "i1", 900, dwell=500),
          event("e3", "impression", "u2", "i1", 2500), event("e4", "impression", "u1", "i2", 4000),
          event("e5", "impression", "u3", "i3", 30_000)]


def renamed(settings: Settings, suffix: str) -> Settings:
    topics = settings.kafka.topics.suffixed(suffix)
    return settings.model_copy(update={"kafka": settings.kafka.model_copy(update={"topics": topics})})


def rows(records: list[dict]) -> set[tuple]:
    return {as_row(r) for r in records}


def test_cluster_submission_matches_embedded(settings: Settings, tmp_path: Path) -> None:
    s = job_settings(settings, checkpoint_dir=tmp_path / "checkpoints")
    embedded, clustered = renamed(s, "embedded"), renamed(s, "cluster")
    for each in (embedded, clustered):
        create_topics(each)
        produce(each, EVENTS)
    def expect(got: ConsumedBatch) -> bool:
        # 3 s windows: 5 keys in [T, T+3s), 3 in [T+3s, T+6s); a user's or item's is the 6 s horizon's tile too
        return len(got.records) >= 8

    cluster = FlinkCluster(local_services_settings(tmp_path), rest_port=free_port(), rpc_port=free_port())
    assert cluster.start().startswith("started on")
    assert job_running(f"http://127.0.0.1:{free_port()}") is None  # no answer: the keeper must not resubmit
    try:
        assert job_running(cluster.rest_url) is False
        c = clustered
        env = {"RTREC_KAFKA__BOOTSTRAP_SERVERS": c.kafka.bootstrap_servers,
               **{f"RTREC_KAFKA__TOPICS__{k.upper()}": v for k, v in c.kafka.topics.model_dump().items()},
               "RTREC_FLINK__HORIZONS_S": "[6]",
               "RTREC_FLINK__CHECKPOINT_INTERVAL_MS": "1000",
               "RTREC_FLINK__GROUP_ID": f"cluster-{uuid.uuid4().hex[:6]}",
               "RTREC_FLINK__CHECKPOINT_DIR": str(tmp_path / "cluster-checkpoints")}
        job_id = cluster.submit(["--no-samples"], env=env)
        remote = wait_for(c, c.kafka.topics.features, "FeatureRecord", expect, timeout_s=120)
        assert job_running(cluster.rest_url) is True
        cluster.cancel(job_id)
        deadline = time.monotonic() + 60
        while job_running(cluster.rest_url) and time.monotonic() < deadline:
            time.sleep(1)
        assert job_running(cluster.rest_url) is False
    finally:
        cluster.stop()

    with running_job(embedded, with_samples=False):
        local = wait_for(embedded, embedded.kafka.topics.features, "FeatureRecord", expect)
    assert rows(remote.records) == rows(local.records)
    assert len(local.records) == 8
    assert sum(r["tile_of_horizons_s"] == [6] for r in local.records) == 5
