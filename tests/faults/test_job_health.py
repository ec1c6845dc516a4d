"""`rtrec features run` when its job keeps failing: the checkpoint disk fills up mid-run. Each restart
is reported with its root cause, the process gives up with exit 1 after `flink.max_restarts`, and once
the disk has room a new run resumes from the newest checkpoint and ends with the windows of an
uninterrupted run: nothing lost, nothing twice for a read_committed reader."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from core.settings import Settings
from rtrec.cli.main import cli
from tests.faults.runs import env_of, reference_run, rtrec_process, windows
from tests.faults.test_trainer_faults import wait_until
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, wait_for
from tests.infra import free_port

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PHASE1 = [event(f"a{k}", "click" if k % 6 == 0 else "impression", f"u{k % 5}", f"i{k % 4}", 200 * k)
          for k in range(300)]  # a minute of events
PHASE2 = [event(f"b{k}", "impression", f"u{k % 5}", f"i{k % 3}", 61_000 + 200 * k) for k in range(100)]
PHASE2 += [event("flush", "impression", "flush-user", "flush-item", 120_000)]


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in text.splitlines()
                                                   if line.startswith("rtrec_job_"))}


def test_a_full_checkpoint_disk_is_reported_given_up_on_and_resumed_without_loss(
        settings: Settings, tmp_path: Path, small_disk: Path) -> None:
    reference = job_settings(settings.namespaced("ref-" + uuid.uuid4().hex[:6]), checkpoint_dir=tmp_path / "ref")
    expected = reference_run(reference, PHASE1 + PHASE2).windows

    s = job_settings(settings.namespaced("full-" + uuid.uuid4().hex[:6]), checkpoint_dir=small_disk / "checkpoints",
                     log_dir=tmp_path / "flink-logs", job_metrics_port=free_port(), checkpoint_failures_tolerated=0,
                     max_restarts=2, restart_delay_ms=3000)
    create_topics(s)
    produce(s, PHASE1)
    log = tmp_path / "features-run.log"
    job = rtrec_process(s, log, "features", "run", "--no-loader")
    try:
        wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: len(got.records) > 20, timeout_s=120)
        # Flink's REST API caches checkpoint statistics for a few seconds: the first completed
        # checkpoint (the records above are its committed output) may not be listed yet.
        deadline = time.monotonic() + 30
        while True:
            status = CliRunner().invoke(cli, ["features", "status"], env=env_of(s))
            assert status.exit_code == 0, status.output
            report = json.loads(status.output)
            assert report["job"]["state"] == "RUNNING" and report["job"]["restarts"] == 0, report
            if report["job"]["last_checkpoint_id"] is not None or time.monotonic() > deadline:
                break
            time.sleep(1)
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

        def kept_full() -> None:
            """The pages the job frees (the checkpoint a new one subsumed, deleted) are taken again, as
            by another writer: once, a full-suite run's job completed one checkpoint after another in the
            space the one before had freed, and never failed."""
            with contextlib.suppress(OSError), open(filler, "ab", buffering=0) as out:
                while out.write(bytes(4096)):
                    pass

        try:
            wait_until(lambda: kept_full() or job.poll() is not None, 120, "features run giving up", log)
        except AssertionError as exc:  # say where the checkpoints stood: a full-suite run once waited here
            status = CliRunner().invoke(cli, ["features", "status"], env=env_of(s))
            raise AssertionError(f"{exc}\nfeatures status:\n{status.output}") from None
    finally:
        if job.poll() is None:
            job.kill()
    out = log.read_text()
    assert job.returncode == 1, out[-3000:]
    assert re.search(r"feature job RESTARTING \(restart \d; .*No space left on device", out), out[-3000:]
    # each restart once, though its RESTARTING state lasts several of features run's one-second ticks
    told = [int(n) for n in re.findall(r"RESTARTING \(restart (\d+);", out)]
    assert told == sorted(set(told)) and max(told) <= 2, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: feature job ") and "No space left on device" in last, out[-3000:]

    filler.unlink()
    produce(s, PHASE2)  # arrives while no job runs
    job = rtrec_process(s, log, "features", "run", "--no-loader")
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
