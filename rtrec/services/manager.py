"""`rtrec services up|down|status` over every local service, plain or secured."""

from __future__ import annotations

from core.settings import ServicesSettings
from rtrec.services.credentials import LocalCredentials
from rtrec.services.kafka_broker import KafkaBroker
from rtrec.services.redis_server import RedisServer

Service = KafkaBroker | RedisServer


def services(cfg: ServicesSettings, names: list[str] | None = None) -> dict[str, Service]:
    every: dict[str, Service] = {"redis": RedisServer(cfg), "kafka": KafkaBroker(cfg)}
    unknown = set(names or []) - set(every)
    if unknown:
        raise ValueError(f"unknown service(s) {sorted(unknown)}; known: {sorted(every)}")
    return {n: s for n, s in every.items() if not names or n in names}


def _both_modes(cfg: ServicesSettings) -> list[ServicesSettings]:
    """The plain and the secured services keep separate state: `down` and `status` look at both."""
    return [cfg.model_copy(update={"secure": cfg.secure.model_copy(update={"enabled": on})}) for on in (False, True)]


def up(cfg: ServicesSettings, names: list[str] | None = None) -> dict[str, str]:
    return {name: svc.start() for name, svc in services(cfg, names).items()}


def down(cfg: ServicesSettings, names: list[str] | None = None) -> dict[str, str]:
    said: dict[str, str] = {}
    for mode in _both_modes(cfg):
        for name, svc in reversed(services(mode, names).items()):
            text = svc.stop()
            if text != "not running" or name not in said:
                said[name] = text
    return said


def status(cfg: ServicesSettings) -> dict[str, str]:
    said: dict[str, str] = {}
    for mode in _both_modes(cfg):
        for name, svc in services(mode).items():
            text = svc.status()
            if text != "stopped" or name not in said:
                said[name] = text
    return said


def client_settings_file(cfg: ServicesSettings) -> str | None:
    """Where the secured services' client settings are written (None for plain services)."""
    return str(LocalCredentials.of(cfg).client_toml) if cfg.secure.enabled else None
