"""Writing events from a source into the interactions topic, paced and with progress."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from core.kafka import ensure_topics, producer_config
from core.settings import Settings
from rtrec.sources.replay import ColumnMapping, check_time_range, read_logs
from rtrec.sources.synthetic import SyntheticEvents
from schemas.dead_letter import dead_letter
from schemas.kafka_io import AvroProducer


@dataclass
class ProduceSummary:
    read: int
    produced: int
    rejected: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.produced / self.seconds if self.seconds > 0 else 0.0


def _events_producer(settings: Settings) -> AvroProducer:
    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.events, k.topics.dead_letter], k.partitions,
                  security=k.security.librdkafka())
    cfg = producer_config(k.bootstrap_servers, k.linger_ms, k.batch_size_bytes, k.compression,
                          **k.security.librdkafka())
    return AvroProducer(cfg, k.topics.events, "InteractionEvent")


def _send(producer: AvroProducer, events: Iterable[dict[str, Any]], total: int | None, rate: float | None,
          speedup: float | None, progress: bool, should_stop: Callable[[], bool] = lambda: False) -> int:
    """Produces keyed by user (so a user's events stay ordered in one partition), paced by `rate`
    events/s or by `speedup` x event time, until `total` or `should_stop()`; everything sent is
    delivered before it returns. Returns the number produced."""
    n = 0
    started = time.monotonic()
    first_event_ms: int | None = None
    bar = tqdm(total=total, unit="ev", disable=not progress, file=sys.stderr, mininterval=0.5)
    for event in events:
        if should_stop():
            break
        if speedup:
            first_event_ms = first_event_ms if first_event_ms is not None else event["event_time"]
            due = (event["event_time"] - first_event_ms) / 1000.0 / speedup
            ahead = due - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        elif rate and n % 100 == 0:
            ahead = n / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        producer.produce(event, key=event["user_id"], timestamp_ms=event["event_time"])
        n += 1
        if n % 1000 == 0:
            bar.update(1000)
        if total is not None and n >= total:
            break
    bar.update(n % 1000)
    bar.close()
    producer.flush()
    return n


def produce_synthetic(settings: Settings, n: int | None, rate: float | None = None, start_ms: int | None = None,
                      progress: bool = True, live: bool = False,
                      should_stop: Callable[[], bool] = lambda: False) -> ProduceSummary:
    """`n` synthetic events (None: endless) at `rate` events/s (None: as fast as possible). `live`
    paces by event time instead, so event time follows the wall clock (each event is sent when its
    time comes; the rate is then the generator's `events_per_second_event_time` plus its clicks)."""
    start = int(time.time() * 1000) if start_ms is None else start_ms
    producer = _events_producer(settings)
    began = time.monotonic()
    produced = _send(producer, SyntheticEvents(settings.synthetic, start), n, None if live else rate,
                     1.0 if live else None, progress, should_stop)
    return ProduceSummary(produced, produced, 0, time.monotonic() - began)


def produce_replay(settings: Settings, paths: Path | Sequence[Path], mapping: ColumnMapping,
                   speedup: float | None = None, progress: bool = True, report: Any = None,
                   items_by_file: bool = False) -> ProduceSummary:
    """Replays one or more log files, merged, in event-time order; malformed rows are reported with
    their file and line, counted, and written to the dead-letter topic with the reason."""
    began = time.monotonic()
    events, rejected, n_rows = read_logs([paths] if isinstance(paths, Path) else list(paths), mapping,
                                         items_by_file)
    f = settings.flink
    now = int(time.time() * 1000)
    oldest = f.min_event_time_ms if f.max_event_age_ms is None else max(f.min_event_time_ms, now - f.max_event_age_ms)
    check_time_range(events, oldest, now + f.max_future_skew_ms,
                     "RTREC_FLINK__MIN_EVENT_TIME_MS, RTREC_FLINK__MAX_EVENT_AGE_MS or RTREC_FLINK__MAX_FUTURE_SKEW_MS "
                     "(the flink section of the settings)")
    producer = _events_producer(settings)
    produced = _send(producer, events, len(events), None, speedup, progress)
    if rejected:
        k = settings.kafka
        dead = AvroProducer(producer_config(k.bootstrap_servers, **k.security.librdkafka()), k.topics.dead_letter,
                            "DeadLetter")
        now = int(time.time() * 1000)
        for r in rejected:
            if report is not None:
                report(f"{r.source}:{r.line}: rejected: {r.reason}")
            dead.produce(dead_letter("replay", r.as_reject(), now))
        dead.flush()
    return ProduceSummary(n_rows, produced, len(rejected), time.monotonic() - began)
