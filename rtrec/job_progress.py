"""Waiting for a bounded run of the feature job (backfill, evaluate) and saying how far it has read.

The Kafka source commits its offsets to its group when a checkpoint completes, so the group's offsets
tell how much of the range the job has read, at most a checkpoint interval behind, without touching
the job."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from core.kafka import committed_offsets
from core.settings import Settings


def records_read(committed: Mapping[int, int], offsets: Mapping[int, tuple[int, int]]) -> int:
    """How many of the range's records lie before the committed offsets.

    >>> records_read({0: 120, 1: -1, 2: 900}, {0: (100, 200), 1: (0, 50), 2: (0, 400)})
    420
    """
    return sum(min(max(committed.get(p, -1), start), end) - start for p, (start, end) in offsets.items())


def wait_reporting_reads(job: Any, settings: Settings, offsets: Mapping[int, tuple[int, int]],
                         say: Callable[[str], None], what: str) -> None:
    """Waits for `job` (a TableResult) to end; every flink.progress_every_s says how many of the
    range's records (`offsets`: per partition of the events topic, [start, end)) the job has read. The
    job's own error is raised as it is."""
    k, every_s = settings.kafka, settings.flink.progress_every_s
    total = sum(end - start for start, end in offsets.values())
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            job.wait()
            outcome.append(None)
        except BaseException as exc:  # raised in the caller's thread below
            outcome.append(exc)

    waiter = threading.Thread(target=wait, name=f"{what}-wait", daemon=True)
    began = time.monotonic()
    waiter.start()
    while True:
        waiter.join(every_s)
        if not waiter.is_alive():
            break
        running = f"[{what}] job running for {time.monotonic() - began:.0f} s"
        try:
            read = records_read(committed_offsets(k.bootstrap_servers, settings.flink.group_id, k.topics.events,
                                                  security=k.security.librdkafka()), offsets)
        except Exception as exc:  # noqa: BLE001 - a progress line never ends the run: the job decides
            say(f"{running} (progress unknown: {exc})")
            continue
        share = f" ({read / total:.0%})" if total else ""
        say(f"{running}: {read:,} of {total:,} events read{share} as of the last checkpoint")
    if outcome[0] is not None:
        raise outcome[0]
