"""How long-running commands stop (rtrec/cli/signals.py), in a real child process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]
# Finishing takes 30 s here (as a slow final snapshot would), unless told to stop for good.
CHILD = """
import sys, time
from rtrec.cli.signals import graceful_stop
with graceful_stop(timeout_s=float(sys.argv[1])) as stop:
    print("ready", flush=True)
    stop.wait()
    print("finishing", flush=True)
    time.sleep(30)
"""


def start(timeout_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(timeout_s)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_first_signal_asks_to_finish_second_exits_at_once() -> None:
    proc = start(timeout_s=60)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline() == "finishing\n"
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 128 + signal.SIGINT and time.monotonic() - began < 5
    lines = proc.stderr.read().strip().splitlines()  # type: ignore[union-attr]
    assert lines[0].startswith("SIGTERM received: finishing (at most 60 s)")
    assert lines[-1] == "second SIGINT: exiting now, without finishing"


def test_finishing_is_bounded_in_time() -> None:
    proc = start(timeout_s=1)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM and time.monotonic() - began < 5
    assert proc.stderr.read().strip().splitlines()[-1] == "did not stop within 1 s of SIGTERM; exiting now"  # type: ignore[union-attr]
