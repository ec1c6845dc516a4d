"""Real Kafka and Redis for tests: testcontainers when a Docker engine answers, else local processes.

Either way the tests receive a bootstrap address and a Redis URL and cannot tell the difference.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.settings import ServicesSettings, load_settings
from rtrec.services import manager


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    redis_url: str
    how: str  # "testcontainers" or "local processes"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def docker_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def containers() -> Iterator[Endpoints]:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.redis import RedisContainer

    with KafkaContainer("apache/kafka:4.1.1").with_kraft() as kafka, RedisContainer("redis:7.4.2") as redis:
        host = redis.get_container_host_ip()
        yield Endpoints(kafka.get_bootstrap_server(), f"redis://{host}:{redis.get_exposed_port(6379)}/0",
                        "testcontainers")


def local_services_settings(state_dir: Path) -> ServicesSettings:
    base = load_settings().services
    return base.model_copy(update={"state_dir": state_dir, "kafka_port": free_port(),
                                   "kafka_controller_port": free_port(), "redis_port": free_port()})


@contextlib.contextmanager
def local_processes(state_dir: Path) -> Iterator[Endpoints]:
    cfg = local_services_settings(state_dir)
    try:
        manager.up(cfg)
        yield Endpoints(f"{cfg.host}:{cfg.kafka_port}", f"redis://{cfg.host}:{cfg.redis_port}/0", "local processes")
    finally:
        manager.down(cfg)
