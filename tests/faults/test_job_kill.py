"""`rtrec features run` (the embedded mini-cluster and the loader in it) killed with SIGKILL mid-run,
its whole process group at once, as a lost machine would be; a new run resumes from the newest retained
checkpoint. Compared with an uninterrupted run of the same events: the same windows and the same
samples (in blocks of up to 8, which a kill must not split or repeat), none twice for a read_committed
reader, and the same Redis contents (the loader read uncommitted windows that the kill then aborted)."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from core.settings import Settings
from flink_jobs.runner import latest_checkpoint
from schemas.kafka_io import read_topic
from tests.faults.runs import redis_contents, reference_run, rtrec_process, settled_samples, windows
from tests.faults.test_trainer_faults import wait_until
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PHASE1 = [event(f"a{k}", "click" if k % 6 == 0 else "impression", f"u{k % 5}", f"i{k % 4}", 200 * k)
          for k in range(300)]
PHASE2 = [event(f"b{k}", "click" if k % 7 == 0 else "impression", f"u{k % 6}", f"i{k % 3}", 60_000 + 200 * k)
          for k in range(200)]
PHASE2 += [event("flush", "impression", "flush-user", "flush-item", 120_000)]


def test_kill_9_of_the_whole_job_process_resumes_from_its_checkpoint_with_nothing_lost_or_doubled(
        settings: Settings, tmp_path: Path) -> None:
    ref = job_settings(settings.namespaced("ref-" + uuid.uuid4().hex[:6]), checkpoint_dir=tmp_path / "ref",
                       samples_per_message=8)
    reference = reference_run(ref, PHASE1 + PHASE2,
                              with_samples=True)  # as `features run`: the users' recent lists in Redis too
    expected, expected_redis = reference.windows, reference.redis
    expected_samples = settled_samples(read_topic(ref.kafka.bootstrap_servers, ref.kafka.topics.samples,
                                                  "TrainingSample").records, ref)

    run = settings.namespaced("kill-" + uuid.uuid4().hex[:6])
    s = job_settings(run, checkpoint_dir=tmp_path / "checkpoints", log_dir=tmp_path / "flink-logs",
                     checkpoint_interval_ms=3000, samples_per_message=8)
    # the killed run checkpoints every 10 s: the kill must land while phase 2's windows are sent but not
    # committed, and with 3 s a checkpoint sometimes committed them while the test was reading the topic
    killed = job_settings(run, checkpoint_dir=tmp_path / "checkpoints", log_dir=tmp_path / "flink-logs",
                          checkpoint_interval_ms=10_000, samples_per_message=8)
    create_topics(s)
    produce(s, PHASE1)
    log = tmp_path / "features-run.log"
    job = rtrec_process(killed, log, "features", "run")
    try:
        wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: len(got.records) > 20, timeout_s=120)
        produce(s, PHASE2[:100])
        # killed once windows of phase 2 were sent but not yet committed (checkpoints every 3 s)
        wait_for(s, s.kafka.topics.features, "FeatureRecord", isolation_level="read_uncommitted", timeout_s=60,
                 done=lambda got: any(r["window_start"] >= PHASE2[0]["event_time"] for r in got.records))
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    assert latest_checkpoint(s.flink.checkpoint_dir) is not None
    produce(s, PHASE2[100:])  # arrives while nothing runs

    job = rtrec_process(s, log, "features", "run")
    try:
        got = wait_for(s, s.kafka.topics.features, "FeatureRecord", timeout_s=180,
                       done=lambda batch: len(windows(batch.records)) >= len(expected))
        samples = wait_for(s, s.kafka.topics.samples, "TrainingSample", timeout_s=60,
                           done=lambda batch: len(settled_samples(batch.records, s)) >= len(expected_samples))
        # (the loader's committed offsets stay one short of the end: a transaction's commit marker)
        wait_until(lambda: redis_contents(s) == expected_redis, 60, "Redis reaching the uninterrupted run's state", log)
        job.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    keys = [w[:4] for w in windows(got.records)]
    assert len(keys) == len(set(keys)), "a window was sent twice"
    assert windows(got.records) == expected
    k = s.kafka
    aborted = len(read_topic(k.bootstrap_servers, k.topics.features, "FeatureRecord",
                             isolation_level="read_uncommitted").records) - len(got.records)
    assert aborted > 0, "nothing was aborted by the kill: the Redis comparison below would prove little"
    assert redis_contents(s) == expected_redis and len(expected_redis) > 20
    ids = [r["sample_id"] for r in samples.records]
    assert len(ids) == len(set(ids)), "a sample was sent twice"
    assert settled_samples(samples.records, s) == expected_samples and len(expected_samples) > 300
