"""A demo deletes what earlier demo runs left in Redis, and nothing else."""

from __future__ import annotations

import pytest
import redis

from core.settings import Settings
from rtrec.demo import delete_old_demo_keys

pytestmark = pytest.mark.integration


def test_the_keys_of_earlier_demo_runs_are_deleted_and_no_others(settings: Settings) -> None:
    prefix = settings.redis.key_prefix
    client = redis.Redis.from_url(settings.redis.url)
    old = [f"{prefix}:demo-20261204-071245-7aa0:f:user:u1", f"{prefix}:demo-20261204-071245-7aa0:progress"]
    kept = [f"{prefix}:demo-mine:f:user:u1", f"{prefix}:f:user:u1", f"{prefix}x:demo-20261204-071245-7aa0:f:user:u1"]
    for key in old + kept:
        client.set(key, "1")

    assert delete_old_demo_keys(settings) == 2

    assert [client.exists(key) for key in old + kept] == [0, 0, 1, 1, 1]
