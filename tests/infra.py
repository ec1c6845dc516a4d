"""Real Kafka and Redis for tests: testcontainers when a Docker engine answers, else local processes.

Either way the tests receive a bootstrap address and a Redis URL and cannot tell the difference.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
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


_HANDED_OUT: set[int] = set()  # never the same port twice in one test session


def free_port() -> int:
    """A free port for a server that binds it later (see `free_ports`)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` free ports below the kernel's ephemeral range (32768 and up): the servers the tests start
    bind them only seconds later, and a port the kernel handed out (bind to port 0) is one it hands out
    again: a starting JVM once took the REST port picked that way for its own sockets."""
    found: list[int] = []
    for port in random.sample(range(21_000, 32_000), 1000):
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        _HANDED_OUT.add(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"not {count} free ports between 21000 and 32000")


def docker_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def kafka_container_env(host_port: int) -> dict[str, str]:
    """The single-node KRaft broker the local process runs (rtrec/services/kafka_broker.py), as the
    official apache/kafka image reads its config: KAFKA_FOO_BAR -> foo.bar."""
    props = {"node.id": "1", "process.roles": "broker,controller",
             # the broker talks to itself (transaction markers, for one) on a listener it can reach
             # inside the container; clients on the host get the published port
             "listeners": "PLAINTEXT://:9092,INTERNAL://:19092,CONTROLLER://:9093",
             "advertised.listeners": f"PLAINTEXT://127.0.0.1:{host_port},INTERNAL://localhost:19092",
             "inter.broker.listener.name": "INTERNAL",
             "controller.listener.names": "CONTROLLER", "controller.quorum.voters": "1@localhost:9093",
             "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",
             "num.partitions": "2", "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "4",
             "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
             "transaction.state.log.num.partitions": "4", "group.initial.rebalance.delay.ms": "0",
             "transaction.max.timeout.ms": "3600000", "log.retention.ms": "-1"}
    return {"KAFKA_" + key.upper().replace(".", "_"): value for key, value in props.items()}


def _without_ryuk_unless_present() -> None:
    """testcontainers' reaper container is pulled at first use: where the engine cannot pull it, the
    fixtures stop their own containers instead (the `with` blocks below)."""
    import docker
    from testcontainers.core.config import testcontainers_config

    try:
        docker.from_env(timeout=3).images.get(testcontainers_config.ryuk_image)
    except Exception:
        testcontainers_config.ryuk_disabled = True


@contextlib.contextmanager
def containers(timeout_s: float = 90.0) -> Iterator[Endpoints]:
    from confluent_kafka.admin import AdminClient
    from testcontainers.community.redis import RedisContainer
    from testcontainers.core.container import DockerContainer

    _without_ryuk_unless_present()
    port = free_port()
    kafka = DockerContainer("apache/kafka:4.1.1").with_bind_ports(9092, port)
    for name, value in kafka_container_env(port).items():
        kafka.with_env(name, value)
    with kafka, RedisContainer("redis:7.4.2") as redis:
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if admin.list_topics(timeout=2).brokers:
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Kafka container did not answer on {bootstrap} within {timeout_s:.0f} s")
            time.sleep(0.5)
        host = redis.get_container_host_ip()
        yield Endpoints(bootstrap, f"redis://{host}:{redis.get_exposed_port(6379)}/0", "testcontainers")


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
