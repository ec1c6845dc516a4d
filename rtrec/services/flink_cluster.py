"""A standalone Flink cluster on 127.0.0.1 from the apache-flink pip package's own `bin/` scripts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from core.settings import ServicesSettings
from flink_jobs.session_cluster import SessionCluster, SessionClusterError, flink_home
from rtrec.services.process import ServiceError, log_tail, require_free_port

NAME = "flink"



def default_java_opts() -> str:
    """The JVM flags the package's own config.yaml sets (Java 17 module opens Flink needs)."""
    import yaml

    config = yaml.safe_load((flink_home() / "conf" / "config.yaml").read_text()) or {}
    return str(config.get("env", {}).get("java", {}).get("opts", {}).get("all", ""))


def cluster_config(host: str, rest_port: int, rpc_port: int, slots: int, pid_dir: Path, python: str) -> str:
    """config.yaml: every address on loopback; the venv's python for clients and workers."""
    return "\n".join([
        f"env.java.opts.all: {default_java_opts()}",
        f"jobmanager.rpc.address: {host}", f"jobmanager.rpc.port: {rpc_port}", f"jobmanager.bind-host: {host}",
        "jobmanager.memory.process.size: 1024m",
        f"taskmanager.host: {host}", f"taskmanager.bind-host: {host}", f"taskmanager.numberOfTaskSlots: {slots}",
        "taskmanager.memory.process.size: 1728m",
        f"rest.address: {host}", f"rest.bind-address: {host}", f"rest.port: {rest_port}",
        f"python.executable: {python}", f"python.client.executable: {python}",
        f"env.pid.dir: {pid_dir}", "parallelism.default: 1", "",
    ])


class FlinkCluster:
    def __init__(self, cfg: ServicesSettings, rest_port: int = 18081, rpc_port: int = 16123, slots: int = 2) -> None:
        self.cfg = cfg
        self.home = cfg.state_dir / NAME
        self.conf_dir = self.home / "conf"
        self.log_dir = self.home / "log"
        self.rest_port = rest_port
        self.rpc_port = rpc_port
        self.slots = slots
        self.rest_url = f"http://{cfg.host}:{rest_port}"

    def env(self) -> dict[str, str]:
        # An embedded PyFlink gateway in this process exports FLINK_* and JVM_ARGS; the cluster needs its own.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_") and k != "JVM_ARGS"}
        return {**clean, "FLINK_HOME": str(flink_home()), "FLINK_CONF_DIR": str(self.conf_dir),
                "FLINK_LOG_DIR": str(self.log_dir)}

    def overview(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"{self.rest_url}/overview", timeout=2) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def healthy(self) -> bool:
        info = self.overview()
        return bool(info and info.get("taskmanagers", 0) >= 1)

    def start(self) -> str:
        if self.healthy():
            return "already running"
        if shutil.which("java") is None:
            raise ServiceError("Java 17 (`java`) is needed for the Flink cluster")
        require_free_port("flink rest", self.cfg.host, self.rest_port, "the cluster's rest port")
        require_free_port("flink rpc", self.cfg.host, self.rpc_port, "the cluster's rpc port")
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        home = flink_home()
        for source in [*(home / "conf").glob("log*.properties"), *(home / "conf").glob("logback*.xml")]:
            shutil.copy(source, self.conf_dir / source.name)
        (self.conf_dir / "workers").write_text(f"{self.cfg.host}\n")
        (self.conf_dir / "masters").write_text(f"{self.cfg.host}:{self.rest_port}\n")
        (self.conf_dir / "config.yaml").write_text(
            cluster_config(self.cfg.host, self.rest_port, self.rpc_port, self.slots, self.home, sys.executable))
        result = subprocess.run(["bash", str(home / "bin" / "start-cluster.sh")], env=self.env(),
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise ServiceError(f"start-cluster.sh failed:\n{result.stdout}{result.stderr}")
        deadline = time.monotonic() + self.cfg.start_timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return f"started on {self.rest_url}"
            time.sleep(1)
        logs = sorted(self.log_dir.glob("*.log"))
        self.stop()
        raise ServiceError(f"the Flink cluster did not come up within {self.cfg.start_timeout_s:.0f}s:\n"
                           + "\n".join(log_tail(p, 8) for p in logs))

    def stop(self) -> str:
        home = flink_home()
        subprocess.run(["bash", str(home / "bin" / "stop-cluster.sh")], env=self.env(), capture_output=True)
        return "stopped"

    def status(self) -> str:
        info = self.overview()
        if not info:
            return "stopped"
        return (f"running on {self.rest_url}: {info.get('taskmanagers')} taskmanager(s), "
                f"{info.get('jobs-running')} job(s)")

    def submit(self, args: list[str], env: dict[str, str] | None = None, parallelism: int | None = None) -> str:
        """The feature job (flink_jobs/submit.py ARGS), detached; returns the job id."""
        try:
            # this cluster's own config.yaml for the client: the python of its workers
            return SessionCluster(self.rest_url).submit(args, {"FLINK_CONF_DIR": str(self.conf_dir), **(env or {})},
                                                        parallelism=parallelism)
        except SessionClusterError as exc:
            raise ServiceError(str(exc)) from exc

    def cancel(self, job_id: str) -> None:
        SessionCluster(self.rest_url).cancel(job_id)
