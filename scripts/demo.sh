#!/usr/bin/env bash
# The README's first command: bootstrap, then run the demo (extra arguments go to `rtrec demo`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/bootstrap.sh"
exec "$ROOT/scripts/rtrec" demo "$@"
