"""`rtrec features run` when its job keeps failing: the checkpoint disk fills up mid-run. Each restart
is reported with its root cause, the process gives up with exit 1 after `flink.max_restarts`, and once
the disk has room a new run resumes from the newest checkpoint and ends with the windows of an
uninterrupted run: nothing lost, nothing twice for a read_committed reader."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.log_range import LogRange
from core.settings import Settings
from flink_jobs.runner import start_job
from rtrec.cli.main import cli
from schemas.kafka_io import read_topic
from tests.faults.test_trainer_faults import wait_until
from tests.flink_jobs.harness import T, create_topics, event, job_settings, produce, wait_for
from tests.infra import free_port

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = Path(__file__).parents[2]

PHASE1 = [event(f"a{k}", "click" if k % 6 == 0 else "impression", f"u{k % 5}", f"i{k % 4}", 200 * k)
          for k in range(300)]  # a minute of events
PHASE2 = [event(f"b{k}", "impression", f"u{k % 5}", f"i{k % 3}", 61_000 + 200 * k) for k in range(100)]
PHASE2 += [event("flush", "impression", "w", "i0", 120_000)]


def env_of(s: Settings) -> dict[str, str]:
    f = s.flink
    return {"RTREC_KAFKA__BOOTSTRAP_SERVERS": s.kafka.bootstrap_servers, "RTREC_REDIS__URL": s.redis.url,
            **{f"RTREC_KAFKA__TOPICS__{k.upper()}": v for k, v in s.kafka.topics.model_dump().items()},
            "RTREC_FLINK__HORIZONS_S": "[6]", "RTREC_FLINK__GROUP_ID": f.group_id,
            "RTREC_FLINK__CHECKPOINT_DIR": str(f.checkpoint_dir), "RTREC_FLINK__LOG_DIR": str(f.log_dir),
            "RTREC_FLINK__CHECKPOINT_INTERVAL_MS": "1000", "RTREC_FLINK__CHECKPOINT_FAILURES_TOLERATED": "0",
            "RTREC_FLINK__MAX_RESTARTS": "2", "RTREC_FLINK__RESTART_DELAY_MS": "1000",
            "RTREC_FLINK__JOB_METRICS_PORT": str(f.job_metrics_port)}


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in text.splitlines()
                                                   if line.startswith("rtrec_job_"))}


def features_run(s: Settings, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rtrec", "features", "run", "--no-loader"], cwd=ROOT,
                            env={**os.environ, **env_of(s), "PYTHONPATH": str(ROOT)}, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def windows(records: list[dict]) -> list[tuple]:
    return sorted((r["entity_type"], r["entity_id"], r["horizon_s"], r["window_start"], r["impressions"],
                   r["clicks"]) for r in records if r["window_start"] < T + 110_000)


def test_a_full_checkpoint_disk_is_reported_given_up_on_and_resumed_without_loss(
        settings: Settings, tmp_path: Path, small_disk: Path) -> None:
    reference = job_settings(settings.namespaced("ref-" + uuid.uuid4().hex[:6]), checkpoint_dir=tmp_path / "ref")
    create_topics(reference)
    produce(reference, PHASE1 + PHASE2)
    start_job(reference, resume=False, log_range=LogRange(), with_samples=False).wait()
    expected = windows(read_topic(reference.kafka.bootstrap_servers, reference.kafka.topics.features,
                                  "FeatureRecord").records)

    s = job_settings(settings.namespaced("full-" + uuid.uuid4().hex[:6]), checkpoint_dir=small_disk / "checkpoints",
                     log_dir=tmp_path / "flink-logs", job_metrics_port=free_port())
    create_topics(s)
    produce(s, PHASE1)
    log = tmp_path / "features-run.log"
    job = features_run(s, log)
    try:
        wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: len(got.records) > 20, timeout_s=120)
        status = CliRunner().invoke(cli, ["features", "status"], env=env_of(s))
        assert status.exit_code == 0, status.output
        report = json.loads(status.output)
        assert report["job"]["state"] == "RUNNING" and report["job"]["restarts"] == 0, report
        assert report["job"]["last_checkpoint_id"] is not None, report
        produce(s, [event("poison", "impression", "u1", "i1", 59_900, dwell=-5)])
        port = s.flink.job_metrics_port

        def exported() -> bool:
            with contextlib.suppress(OSError):
                m = scrape(port)
                return (m.get('rtrec_job_dead_letters_total{kind="out_of_range"}') == 1 and m["rtrec_job_running"] == 1
                        and m["rtrec_job_events_in"] >= len(PHASE1) and m["rtrec_job_features_out"] > 20
                        and m["rtrec_job_event_time_lag_seconds"] > 0)  # events of 2023: years behind
            return False

        wait_until(exported, 60, "the job's metrics", log)

        filler = small_disk / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
        wait_until(lambda: job.poll() is not None, 120, "features run giving up", log)
    finally:
        if job.poll() is None:
            job.kill()
    out = log.read_text()
    assert job.returncode == 1, out[-3000:]
    assert re.search(r"feature job RESTARTING \(restart \d; .*No space left on device", out), out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: feature job ") and "No space left on device" in last, out[-3000:]

    filler.unlink()
    produce(s, PHASE2)  # arrives while no job runs
    job = features_run(s, log)
    try:
        got = wait_for(s, s.kafka.topics.features, "FeatureRecord", timeout_s=120,
                       done=lambda batch: len(windows(batch.records)) >= len(expected))
        job.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
    keys = [w[:4] for w in windows(got.records)]
    assert len(keys) == len(set(keys)), "a window was sent twice"
    assert windows(got.records) == expected
