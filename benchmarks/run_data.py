"""What the benchmarks' isolated runs leave on the services they share: every topic named with the
run's id, the Redis keys under its key prefix, its checkpoint or snapshot directory. Removed once the
runs are done, so that a benchmark does not pay for the data of the ones before it. Left in place (as
it was), a day's runs had left 901 topics holding 8.2 GB and 740 MB of Redis keys: an hour later those
keys expired while another run was measured, and Redis rewrote its append-only file of the whole
dataset during it (that run's windows p99 was 3.4 s, against 0.9-1.3 s on a Redis holding only its own
keys)."""

from __future__ import annotations

import contextlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from core.kafka import delete_topics
from core.settings import Settings
from feature_store.redis_store import RedisFeatureStore


@dataclass(frozen=True)
class RunData:
    settings: Settings
    run_id: str
    directory: Path | None  # a temporary directory the run made for itself


_runs: list[RunData] = []


def tracked(settings: Settings, run_id: str, directory: Path | None = None) -> Settings:
    """`settings` of an isolated run (`Settings.namespaced(run_id)`), whose data `remove_runs` removes."""
    _runs.append(RunData(settings, run_id, directory))
    return settings


def run_topics(names: list[str], run_id: str) -> list[str]:
    """The topics of run `run_id`: `namespaced` ends each name with `.<run_id>`, a run's own sinks add a
    suffix after it.

    >>> run_topics(["rtrec.features.bf1", "rtrec.features.bf1.a3c", "rtrec.features.bf12", "rtrec.interactions"], "bf1")
    ['rtrec.features.bf1', 'rtrec.features.bf1.a3c']
    """
    return [n for n in names if n.endswith(f".{run_id}") or f".{run_id}." in n]


def remove_runs(on_services: bool = True) -> None:
    """Removes the data of every run tracked so far; `on_services=False`: their directories only (the
    services went away with their data). A service that does not answer keeps the run's data there,
    never failing the benchmark whose figures are already out."""
    while _runs:
        run = _runs.pop()
        if run.directory is not None:
            shutil.rmtree(run.directory, ignore_errors=True)
        if not on_services:
            continue
        s, k = run.settings, run.settings.kafka
        topics, keys = "kept", "kept"
        with contextlib.suppress(KafkaException):
            admin = AdminClient({"bootstrap.servers": k.bootstrap_servers, **k.security.librdkafka()})
            names = run_topics(list(admin.list_topics(timeout=10).topics), run.run_id)
            failed = delete_topics(k.bootstrap_servers, names, security=k.security.librdkafka())
            topics = str(len(names) - len(failed))
        with contextlib.suppress(redis.RedisError, OSError):
            keys = str(RedisFeatureStore.from_settings(s.redis, s.flink).unlink_matching(f"{s.redis.key_prefix}:*"))
        print(f"removed run {run.run_id}: {topics} topics, {keys} Redis keys", file=sys.stderr, flush=True)
