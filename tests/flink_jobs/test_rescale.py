"""The feature job on a session cluster addressed as an external one (a standalone cluster started apart,
its REST address passed with --jobmanager): `features submit` at parallelism 1, `features rescale 2`
mid-stream (stop with a savepoint, resubmit from it), `features status` and `features stop`, each a
`rtrec` process of its own. The windows equal those of an uninterrupted embedded run of the same events:
nothing lost, nothing twice for a read_committed reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from core.settings import Settings
from rtrec.services.flink_cluster import FlinkCluster
from tests.faults.runs import ROOT, env_of, reference_run, windows
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, wait_for
from tests.infra import free_ports, local_services_settings

pytestmark = pytest.mark.integration

PHASE1 = [event(f"a{k}", "click" if k % 5 == 0 else "impression", f"u{k % 6}", f"i{k % 4}", 250 * k)
          for k in range(200)]
PHASE2 = [event(f"b{k}", "click" if k % 7 == 0 else "impression", f"u{k % 5}", f"i{k % 3}", 60_000 + 250 * k)
          for k in range(180)]
# beyond the compared windows, on users of their own spread over both partitions: pushes every watermark
FLUSH = [event(f"flush{k}", "impression", f"flush-user-{k}", "flush-item", 120_000) for k in range(8)]


def rtrec(s: Settings, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "rtrec", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env_of(s), "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, f"rtrec {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def test_submit_rescale_and_stop_on_an_external_cluster_lose_and_double_nothing(settings: Settings,
                                                                                 tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    expected = reference_run(job_settings(settings.namespaced(f"ref-{run}"), checkpoint_dir=tmp_path / "ref"),
                             PHASE1 + PHASE2 + FLUSH).windows
    s = job_settings(settings.namespaced(f"rescale-{run}"), checkpoint_dir=tmp_path / "checkpoints")
    create_topics(s, partitions=2)
    produce(s, PHASE1)
    rest_port, rpc_port = free_ports(2)
    cluster = FlinkCluster(local_services_settings(tmp_path / "cluster"), rest_port=rest_port, rpc_port=rpc_port)
    assert cluster.start().startswith("started on")
    address = cluster.rest_url.removeprefix("http://")
    try:
        said = rtrec(s, "features", "submit", "--jobmanager", address, "--parallelism", "1", "--no-samples")
        assert f"to {cluster.rest_url}" in said
        wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: len(got.records) > 20, timeout_s=150)

        said = rtrec(s, "features", "rescale", "2", "--jobmanager", address, "--no-samples")
        assert "(parallelism 1) with savepoint file:" in said and "at parallelism 2 from" in said, said
        report = json.loads(rtrec(s, "features", "status", "--jobmanager", address))
        assert [(job["state"], job["parallelism"]) for job in report["cluster"]["jobs"].values()] in (
            [("RUNNING", 2)], [("INITIALIZING", 2)], [("CREATED", 2)]), report["cluster"]

        produce(s, PHASE2 + FLUSH)
        got = wait_for(s, s.kafka.topics.features, "FeatureRecord", timeout_s=180,
                       done=lambda batch: len(windows(batch.records)) >= len(expected))
        assert windows(got.records) == expected
        assert "with savepoint file:" in rtrec(s, "features", "stop", "--jobmanager", address)
    finally:
        cluster.stop()
