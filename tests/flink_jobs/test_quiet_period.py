"""A live job through a quiet spell longer than the source's idle timeout, then a burst: its training
samples (labels and features) equal those of a bounded run of the same events. Under the SQL plan, whose
joins held the watermark back by bounds of their own, every run here lost labels and features after the
spell until the samples had a source of their own; the operators now read one watermark for all."""

from __future__ import annotations

import time
import uuid

import pytest

from core.log_range import LogRange
from core.settings import Settings
from flink_jobs.runner import start_job
from schemas.kafka_io import read_topic
from tests.flink_jobs.harness import T, create_topics, event, job_settings, produce, running_job, wait_for

pytestmark = [pytest.mark.integration]

BEFORE = [event(f"a{k}", "click" if k % 3 == 0 else "impression", f"u{k % 5}", f"i{(k // 3) % 4}", 200 * k)
          for k in range(300)]
AFTER = [event(f"b{k}", "click" if k % 3 == 0 else "impression", f"u{k % 6}", f"i{(k // 3) % 3}",
               60_000 + 200 * k) for k in range(200)]
AFTER += [event("flush", "impression", "flush-user", "flush-item", 160_000)]
SETTLED_MS = T + 110_000  # the flush event's watermark has closed every window and label before this
IDLE_TIMEOUT_MS = 2_000


def settled_samples(s: Settings) -> dict[str, tuple]:
    got = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.samples, "TrainingSample").records
    return {r["sample_id"]: (r["label"], [round(x, 4) for x in r["features"]])
            for r in got if r["event_time"] < SETTLED_MS}


def test_samples_after_a_quiet_spell_equal_a_bounded_runs(settings: Settings) -> None:
    reference = job_settings(settings.namespaced(uuid.uuid4().hex[:8]), attribution_window_s=5)
    create_topics(reference)
    produce(reference, BEFORE + AFTER)
    start_job(reference, resume=False, log_range=LogRange()).wait()
    expected = settled_samples(reference)
    assert len(expected) > 300 and sum(label for label, _ in expected.values()) > 30

    s = job_settings(settings.namespaced(uuid.uuid4().hex[:8]), attribution_window_s=5,
                     idle_timeout_ms=IDLE_TIMEOUT_MS)
    create_topics(s)
    produce(s, BEFORE)
    with running_job(s):
        wait_for(s, s.kafka.topics.samples, "TrainingSample", lambda got: len(got.records) > 20, timeout_s=120)
        time.sleep(4 * IDLE_TIMEOUT_MS / 1000)  # every source partition and operator input turns idle
        produce(s, AFTER)
        wait_for(s, s.kafka.topics.samples, "TrainingSample", timeout_s=120,
                 done=lambda got: len([r for r in got.records if r["event_time"] < SETTLED_MS]) >= len(expected))
        got = settled_samples(s)
    differ = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    assert not differ, f"{len(differ)} samples differ, e.g. {[(k, expected.get(k), got.get(k)) for k in differ[:3]]}"
