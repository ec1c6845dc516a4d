"""Benchmark output: one JSON object per result on stdout, human text on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def emit(bench: str, metric: str, value: float, unit: str, n: int, p50: float | None = None,
         p99: float | None = None, **extra: Any) -> None:
    row = {"bench": bench, "metric": metric, "value": round(value, 3), "unit": unit, "p50": p50, "p99": p99,
           "n": n, "commit": commit(), **extra}
    print(json.dumps(row), flush=True)
    shown = f"{value:>14,.3f}" if unit == "ratio" else f"{value:>14,.1f}"  # a ratio to one decimal read 0.3
    print(f"{bench:>10s}  {metric:<28s} {shown} {unit}", file=sys.stderr, flush=True)
