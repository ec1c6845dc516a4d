"""A local `redis-server` bound to loopback; secured (`services.secure.enabled`), it speaks TLS only and
its one user is confined to the pipeline's keys (the default user is off)."""

from __future__ import annotations

import shutil

from core.settings import RedisSettings, ServicesSettings
from rtrec.services.credentials import PRIVATE, LocalCredentials
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
        self.secure = cfg.secure.enabled
        self.credentials = LocalCredentials.of(cfg)
        self.home = cfg.state_dir / (f"{NAME}-secure" if self.secure else NAME)
        self.pid_file = self.home / "redis.pid"
        self.log_file = self.home / "redis.log"
        self.url = f"{'rediss' if self.secure else 'redis'}://{cfg.host}:{cfg.redis_port}/0"

    def client_settings(self) -> RedisSettings:
        if not self.secure:
            return RedisSettings(url=self.url)
        c = self.credentials
        return RedisSettings(url=self.url, username=self.cfg.secure.user, password_file=c.password_file("redis-user"),
                             ssl_ca_file=c.ca, ssl_cert_file=c.client_cert, ssl_key_file=c.client_key)

    def secured_config(self) -> str:
        """TLS on the service's port and no plain port; one ACL user, its password from the credentials."""
        c, sec = self.credentials, self.cfg.secure
        return "\n".join([
            "port 0", f"tls-port {self.cfg.redis_port}", f"tls-cert-file {c.dir / 'server.pem'}",
            f"tls-key-file {c.dir / 'server.key'}", f"tls-ca-cert-file {c.ca}", "tls-auth-clients optional",
            "user default off",
            f"user {sec.user} on >{c.password('redis-user')} ~{sec.redis_key_prefix}* &* +@all -@admin -@dangerous "
            "+info +scan", ""])

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def healthy(self) -> bool:
        import redis

        settings = self.client_settings()
        try:
            return bool(redis.Redis.from_url(settings.url, socket_timeout=1, socket_connect_timeout=1,
                                             **settings.connection_kwargs()).ping())
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
        cmd = [binary]
        if self.secure:
            # the password sits in a file (mode 600), not on a command line that `ps` shows
            self.credentials.ensure(self.cfg)
            conf = self.home / "redis.conf"
            conf.touch(PRIVATE)
            conf.chmod(PRIVATE)
            conf.write_text(self.secured_config())
            cmd += [str(conf)]
        else:
            cmd += ["--port", str(self.cfg.redis_port)]
        cmd += ["--bind", self.cfg.host, "--dir", str(self.home),
                # Append-only file, fsynced every second: a kill -9 loses at most a second of writes (the
                # loader rewrites them: its offsets follow the writes), never the whole store
                "--daemonize", "no", "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                "--logfile", str(self.log_file),
                "--protected-mode", "yes"]
        pid = start_detached(cmd, self.home / "redis.stdout", self.pid_file, self.home)
        wait_healthy(NAME, pid, self.healthy, self.cfg.start_timeout_s, self.log_file)
        return f"started pid {pid} on {self.url}" + (f" (TLS, user {self.cfg.secure.user})" if self.secure else "")

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
