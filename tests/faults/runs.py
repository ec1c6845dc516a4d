"""What the feature-path fault tests share: the uninterrupted reference run each one compares with
(a bounded run of the same events: it judges nothing late and closes every window at the end of its
input), the views compared (windows, Redis contents), and `rtrec` commands run as processes of their
own with the test's settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from pydantic import BaseModel, SecretStr

from core.log_range import LogRange
from core.settings import Settings
from feature_store.loader import LoaderConfig, run_loader
from feature_store.redis_store import RedisFeatureStore
from flink_jobs.runner import start_job
from schemas.kafka_io import read_topic
from tests.flink_jobs.harness import T, as_row, create_topics, produce

ROOT = Path(__file__).parents[2]
# Each test's last event (its "flush", of entities of its own) lies beyond this: the windows and labels
# before it are final in a live run too.
SETTLED_MS = T + 110_000


def windows(records: list[dict]) -> list[tuple]:
    """The window aggregates (not the users' recent lists, horizon 0, which only a job with samples
    writes: redis_contents holds those)."""
    return sorted((r["entity_type"], r["entity_id"], r["horizon_s"], r["window_start"], r["impressions"],
                   r["clicks"]) for r in records if r["window_start"] < SETTLED_MS and r["horizon_s"] > 0)


def settled_samples(records: list[dict], s: Settings) -> list[tuple]:
    """The samples whose labels were final before SETTLED_MS (an impression's sample waits out its
    attribution window and the base window holding its end), as sorted rows."""
    wait_ms = (s.flink.attribution_window_s + s.flink.window_s) * 1000
    return sorted(as_row(r) for r in records if r["event_time"] + wait_ms < SETTLED_MS)


def redis_contents(s: Settings) -> dict[bytes, dict[bytes, bytes]]:
    """Every feature hash under the run's prefix but the flush entities' (a live job never closes theirs)."""
    client = redis.Redis.from_url(s.redis.url)
    prefix = s.redis.key_prefix.encode()
    return {k.removeprefix(prefix): client.hgetall(k) for k in client.scan_iter(f"{s.redis.key_prefix}:f:*")
            if b"flush-" not in k}


@dataclass(frozen=True)
class Reference:
    windows: list[tuple]
    redis: dict[bytes, dict[bytes, bytes]]


def reference_run(s: Settings, events: list[dict], with_samples: bool = False) -> Reference:
    """`events` through a bounded run in `s`'s own topics, then loaded into Redis read_committed."""
    create_topics(s)
    produce(s, events)
    start_job(s, resume=False, log_range=LogRange(), with_samples=with_samples).wait()
    records = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.features, "FeatureRecord").records
    run_loader(LoaderConfig.from_settings(s, isolation_level="read_committed"),
               RedisFeatureStore.from_settings(s.redis, s.flink), idle_exit_s=2.0)
    return Reference(windows(records), redis_contents(s))


def env_of(s: Settings) -> dict[str, str]:
    """The `RTREC_*` variables under which a `rtrec` process loads `s`: each field that differs from
    its default."""

    def walk(model: BaseModel, default: BaseModel, prefix: str) -> Iterator[tuple[str, str]]:
        for name in type(model).model_fields:
            value, base = getattr(model, name), getattr(default, name)
            if isinstance(value, BaseModel):
                yield from walk(value, base, f"{prefix}{name.upper()}__")
            elif value != base:
                if value is None:
                    raise ValueError(f"{prefix}{name.upper()}: None cannot be set from the environment")
                text = value if isinstance(value, str) else str(value) if isinstance(value, int | float | Path) \
                    else value.get_secret_value() if isinstance(value, SecretStr) else json.dumps(value)
                yield f"{prefix}{name.upper()}", text

    return dict(walk(s, Settings(), "RTREC_"))


def rtrec_process(s: Settings, log: Path, *command: str) -> subprocess.Popen:
    """`rtrec <command>` with the settings `s`, output appended to `log`, in a process group of its own
    (so a test can kill it whole, JVM included, as a lost machine would go)."""
    return subprocess.Popen([sys.executable, "-m", "rtrec", *command], cwd=ROOT,
                            env={**os.environ, **env_of(s), "PYTHONPATH": str(ROOT)}, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
