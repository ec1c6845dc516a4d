#!/usr/bin/env bash
# Installs what the project needs and reuses what is already there:
#   - a Python venv in the cache, keyed by the hash of the lock file requirements/dev.txt (torch is large:
#     install once; scripts/lock-requirements.sh updates the lock);
#   - redis-server (Debian package, installed when missing and running as root);
#   - the Kafka broker and Flink connector jars, resolved by Maven into the cache.
# Prints nothing on a warm machine except one line; leaves `.venv` pointing at the venv.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${RTREC_SERVICES__CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rtrec}
mkdir -p "$CACHE"

say() { echo "[bootstrap] $*" >&2; }
die() { echo "[bootstrap] error: $*" >&2; exit 1; }

as_root_apt() {
    # Installs Debian packages when we are root and apt exists; otherwise says what to install.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing Debian packages: $*"
        if [ ! -f "$CACHE/.apt-updated" ] || ! apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1; then
            apt-get update -qq >/dev/null && touch "$CACHE/.apt-updated"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
        fi
    else
        die "please install: $* (Debian/Ubuntu: sudo apt-get install $*)"
    fi
}

# --- Python ---------------------------------------------------------------------------------
PYTHON=${RTREC_PYTHON:-}
if [ -z "$PYTHON" ]; then
    for candidate in python3.11 python3.12 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            PYTHON=$candidate; break
        fi
    done
fi
[ -n "$PYTHON" ] || die "Python >= 3.11 is required (set RTREC_PYTHON to its path)"

# the pins and hashes, not the comments on where each requirement comes from
KEY=$(grep -v "^ *#" "$ROOT/requirements/dev.txt" | sha256sum | cut -c1-16)
VENV="$CACHE/venv-$KEY"
if [ ! -f "$VENV/.complete" ]; then
    say "creating $VENV (first run: torch and apache-flink are large, this takes several minutes)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q --no-deps --require-hashes -r "$ROOT/requirements/dev.txt"
    touch "$VENV/.complete"
fi
ln -sfn "$VENV" "$ROOT/.venv"

# --- Java, Maven, Redis ---------------------------------------------------------------------
missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v docker-compose >/dev/null || [ "$(id -u)" != 0 ] || missing+=(docker-compose)  # validates docker-compose.yml
[ ${#missing[@]} -eq 0 ] || as_root_apt "${missing[@]}"

# --- Jars -----------------------------------------------------------------------------------
(cd "$ROOT" && "$VENV/bin/python" -m core.maven) || die "could not resolve the Maven jars"
say "ready: venv $VENV"
