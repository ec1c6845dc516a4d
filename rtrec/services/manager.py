"""`rtrec services up|down|status` over every local service."""

from __future__ import annotations

from core.settings import ServicesSettings
from rtrec.services.kafka_broker import KafkaBroker
from rtrec.services.redis_server import RedisServer

Service = KafkaBroker | RedisServer


def services(cfg: ServicesSettings, names: list[str] | None = None) -> dict[str, Service]:
    every: dict[str, Service] = {"redis": RedisServer(cfg), "kafka": KafkaBroker(cfg)}
    unknown = set(names or []) - set(every)
    if unknown:
        raise ValueError(f"unknown service(s) {sorted(unknown)}; known: {sorted(every)}")
    return {n: s for n, s in every.items() if not names or n in names}


def up(cfg: ServicesSettings, names: list[str] | None = None) -> dict[str, str]:
    return {name: svc.start() for name, svc in services(cfg, names).items()}


def down(cfg: ServicesSettings, names: list[str] | None = None) -> dict[str, str]:
    return {name: svc.stop() for name, svc in reversed(services(cfg, names).items())}


def status(cfg: ServicesSettings) -> dict[str, str]:
    return {name: svc.status() for name, svc in services(cfg).items()}
