"""Starting, watching and stopping one detached service process by PID file."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class ServiceError(RuntimeError):
    """A service could not be started or stopped; the message says what to do."""


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free_port(name: str, host: str, port: int, setting: str) -> None:
    if not port_is_free(host, port):
        raise ServiceError(
            f"{name} cannot start: port {port} on {host} is already taken by another process. "
            f"Stop that process or choose another port with {setting}=<port>."
        )


def read_pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited child not yet reaped) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def start_detached(cmd: Sequence[str], log_file: Path, pid_file: Path, cwd: Path,
                   env: dict[str, str] | None = None) -> int:
    """Starts `cmd` in its own session so it outlives the CLI; returns its PID."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=cwd, env={**os.environ, **(env or {})}, start_new_session=True,
        )
    pid_file.write_text(str(proc.pid))
    return proc.pid


def log_tail(log_file: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def wait_healthy(name: str, pid: int, healthy: Callable[[], bool], timeout_s: float, log_file: Path) -> None:
    """Polls `healthy` until it answers, the process dies, or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise ServiceError(f"{name} exited during start-up; last lines of {log_file}:\n{log_tail(log_file)}")
        if healthy():
            return
        time.sleep(0.3)
    stop_pid(pid, 5.0)
    raise ServiceError(
        f"{name} did not become healthy within {timeout_s:.0f}s; last lines of {log_file}:\n{log_tail(log_file)}"
    )


def stop_pid(pid: int, timeout_s: float) -> bool:
    """SIGTERM, then SIGKILL after `timeout_s`; True if the process was running."""
    if not pid_alive(pid):
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            _reap(pid)
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
