"""`services up/down/status` on fresh ports and state dir, with the real binaries."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from rtrec.services import manager
from rtrec.services.process import ServiceError
from rtrec.services.redis_server import RedisServer
from tests.infra import Endpoints, local_services_settings

pytestmark = pytest.mark.integration


def test_up_status_down(tmp_path: Path) -> None:
    cfg = local_services_settings(tmp_path)
    assert manager.status(cfg) == {"redis": "stopped", "kafka": "stopped"}
    try:
        started = manager.up(cfg)
        assert started["redis"].startswith("started pid") and started["kafka"].startswith("started pid")
        status = manager.status(cfg)
        assert status["kafka"] == f"running pid {manager.services(cfg)['kafka'].pid()} on 127.0.0.1:{cfg.kafka_port}"
        assert status["redis"].startswith("running pid") and "not answering" not in status["redis"]
        assert manager.up(cfg) == {"redis": "already running", "kafka": "already running"}
    finally:
        stopped = manager.down(cfg)
    assert stopped["kafka"].startswith("stopped pid") and stopped["redis"].startswith("stopped pid")
    assert manager.status(cfg) == {"redis": "stopped", "kafka": "stopped"}
    assert manager.down(cfg) == {"kafka": "not running", "redis": "not running"}


def test_taken_port_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    cfg = local_services_settings(tmp_path)
    with socket.socket() as squatter:
        squatter.bind((cfg.host, cfg.redis_port))
        squatter.listen()
        with pytest.raises(ServiceError, match=f"port {cfg.redis_port} on 127.0.0.1 is already taken"):
            RedisServer(cfg).start()
    assert RedisServer(cfg).pid() is None


def test_missing_binary_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match="`redis-server` is not installed"):
        RedisServer(local_services_settings(tmp_path)).start()


def test_unknown_service_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown service"):
        manager.up(local_services_settings(tmp_path), ["zookeeper"])


def test_redis_round_trip(endpoints: Endpoints) -> None:
    client = redis.Redis.from_url(endpoints.redis_url)
    with client.pipeline(transaction=False) as pipe:
        for i in range(100):
            pipe.hset(f"test-rt:{i}", mapping={"clicks": i, "ctr": i / 100})
        pipe.execute()
    with client.pipeline(transaction=False) as pipe:
        for i in range(100):
            pipe.hgetall(f"test-rt:{i}")
        rows = pipe.execute()
    assert rows[42] == {b"clicks": b"42", b"ctr": b"0.42"}
    client.delete(*[f"test-rt:{i}" for i in range(100)])
