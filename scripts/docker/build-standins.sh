#!/usr/bin/env bash
# Offline stand-ins for the official images the test fixtures use, for machines whose Docker engine
# cannot pull them (air-gapped, or no registry access): apache/kafka:4.1.1 from the Kafka jars on Maven
# Central and redis:7.4.2 from Debian's redis-server, both FROM a local debian:bookworm-slim.
# Usage: scripts/docker/build-standins.sh   (needs `docker` and a debian:bookworm-slim image)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/scripts/docker/standins"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "run scripts/bootstrap.sh first (it resolves the Kafka jars)" >&2; exit 1; }
JARS=$(cd "$ROOT" && "$PY" -c "from core.maven import resolve_jars; from core.settings import load_settings; \
print(resolve_jars('kafka-pom.xml', load_settings().services.jar_cache_dir))")
CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
cp "$HERE/kafka/Dockerfile" "$HERE/kafka/entrypoint.sh" "$CTX/"
mkdir "$CTX/libs" && cp "$JARS"/*.jar "$CTX/libs/"
time docker build -q -t apache/kafka:4.1.1 "$CTX"
time docker build -q -t redis:7.4.2 "$HERE/redis"
docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(apache/kafka:4.1.1|redis:7.4.2) '
