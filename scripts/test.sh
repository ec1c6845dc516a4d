#!/usr/bin/env bash
# The README's second command: bootstrap, lint, then every test tier but benchmarks. The fixtures
# start real Kafka and Redis (testcontainers when a Docker engine answers, local processes otherwise).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
.venv/bin/python -m ruff check .
packages=()
for dir in core schemas rtrec feature_store flink_jobs gpu_trainer; do [ -d "$dir" ] && packages+=("$dir"); done
exec .venv/bin/python -m pytest -m "not benchmark" --doctest-modules "$@" tests "${packages[@]}"
