"""A local `redis-server` bound to loopback."""

from __future__ import annotations

import shutil

from core.settings import ServicesSettings
from rtrec.services.process import (
    ServiceError,
    read_pid,
    require_free_port,
    start_detached,
    stop_pid,
    wait_healthy,
)

NAME = "redis"


class RedisServer:
    def __init__(self, cfg: ServicesSettings) -> None:
        self.cfg = cfg
        self.home = cfg.state_dir / NAME
        self.pid_file = self.home / "redis.pid"
        self.log_file = self.home / "redis.log"
        self.url = f"redis://{cfg.host}:{cfg.redis_port}/0"

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def healthy(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(host=self.cfg.host, port=self.cfg.redis_port, socket_timeout=1,
                                    socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False

    def start(self) -> str:
        if self.pid() is not None:
            if self.healthy():
                return "already running"
            raise ServiceError(
                f"redis process {self.pid()} exists but does not answer; run `rtrec services down` first"
            )
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceError("`redis-server` is not installed; install it (Debian: apt-get install redis-server) "
                               "or run scripts/bootstrap.sh as root, which installs it.")
        require_free_port("redis", self.cfg.host, self.cfg.redis_port, "RTREC_SERVICES__REDIS_PORT")
        self.home.mkdir(parents=True, exist_ok=True)
        cmd = [binary, "--bind", self.cfg.host, "--port", str(self.cfg.redis_port), "--dir", str(self.home),
               # Append-only file, fsynced every second: a kill -9 loses at most a second of writes (the
               # loader rewrites them: its offsets follow the writes), never the whole store
               "--daemonize", "no", "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
               "--logfile", str(self.log_file),
               "--protected-mode", "yes"]
        pid = start_detached(cmd, self.home / "redis.stdout", self.pid_file, self.home)
        wait_healthy(NAME, pid, self.healthy, self.cfg.start_timeout_s, self.log_file)
        return f"started pid {pid} on {self.url}"

    def stop(self) -> str:
        pid = self.pid()
        if pid is None:
            return "not running"
        stop_pid(pid, self.cfg.stop_timeout_s)
        self.pid_file.unlink(missing_ok=True)
        return f"stopped pid {pid}"

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return f"running pid {pid} on {self.url}" + ("" if self.healthy() else " (not answering)")
