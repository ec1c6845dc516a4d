#!/usr/bin/env bash
# Pins every Python requirement, with hashes, for Linux/macOS/Windows and Python >= 3.11 at once
# (uv's universal resolution), so the host venv and both images install the same software:
#   requirements/dev.txt      runtime.in + test.in   (scripts/bootstrap.sh; its hash is the venv cache key)
#   requirements/runtime.txt  runtime.in             (an install of the CLI without the test tools)
#   requirements/app.txt      app.in                 (the app image: producer, loader, trainer)
#   requirements/job.txt      job.in                 (the Flink image; Ubuntu's Python 3.12 in the official base)
# The last three are constrained by dev.txt, so a package has one version everywhere.
# Existing pins are kept; to move them: scripts/lock-requirements.sh --upgrade (or --upgrade-package NAME).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${RTREC_SERVICES__CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rtrec}
UV_VERSION=0.13.9
TOOLS="$CACHE/uv-$UV_VERSION"
if [ ! -x "$TOOLS/bin/uv" ]; then
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q "uv==$UV_VERSION"
fi
cd "$ROOT/requirements"
compile() {
    "$TOOLS/bin/uv" pip compile -q --universal --python-version 3.11 --generate-hashes \
        --custom-compile-command "scripts/lock-requirements.sh" "$@"
}
compile "${@}" runtime.in test.in -o dev.txt
compile "${@}" runtime.in -c dev.txt -o runtime.txt
compile "${@}" app.in -c dev.txt -o app.txt
compile "${@}" job.in -c dev.txt -o job.txt
wc -l dev.txt runtime.txt app.txt job.txt
