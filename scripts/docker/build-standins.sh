#!/usr/bin/env bash
# Offline stand-ins for the official images that docker-compose.yml, the Dockerfiles and the test
# fixtures name, for machines whose Docker engine cannot pull them (air-gapped, or no registry access).
# Each is built FROM a local debian:bookworm-slim and tagged with the official name:
#   apache/kafka:4.1.1                 the Kafka jars from Maven Central (core/poms/kafka-pom.xml)
#   redis:7.4.2                        Debian's redis-server
#   flink:2.2.1-java17                 the Flink distribution inside the apache-flink-libraries wheel
#   python:3.11.11-slim-bookworm       Debian's Python 3.11
#   maven:3.9.9-eclipse-temurin-17     Debian's Maven and JDK 17
# Usage: scripts/docker/build-standins.sh [NAME...]   (names: kafka redis flink python maven; default all)
# Needs `docker`, a debian:bookworm-slim image and the bootstrapped venv (for the jars and the Flink dist).
# An image already present under its name is kept; remove it to rebuild.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/scripts/docker/standins"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "run scripts/bootstrap.sh first (it resolves the Kafka jars and installs the Flink wheel)" >&2; exit 1; }
docker image inspect debian:bookworm-slim >/dev/null 2>&1 \
  || { echo "no debian:bookworm-slim image: pull it, or build one with debootstrap (see README, Docker Compose)" >&2; exit 1; }
CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT

build() {  # name tag context
  if docker image inspect "$2" >/dev/null 2>&1; then echo "$2: present"; return; fi
  local start=$SECONDS
  docker build -q -t "$2" "$3" >/dev/null
  echo "$2: built in $((SECONDS - start)) s"
}

for name in ${@:-kafka redis flink python maven}; do
  case $name in
    kafka)
      JARS=$(cd "$ROOT" && "$PY" -c "from core.maven import resolve_jars; from core.settings import load_settings; \
print(resolve_jars('kafka-pom.xml', load_settings().services.jar_cache_dir))")
      mkdir -p "$CTX/kafka/libs" && cp "$HERE/kafka/Dockerfile" "$HERE/kafka/entrypoint.sh" "$CTX/kafka/"
      cp "$JARS"/*.jar "$CTX/kafka/libs/"
      build kafka apache/kafka:4.1.1 "$CTX/kafka" ;;
    redis) build redis redis:7.4.2 "$HERE/redis" ;;
    flink)
      DIST=$("$PY" -c "import pyflink, pathlib; print(pathlib.Path(pyflink.__file__).parent)")
      mkdir -p "$CTX/flink/dist" && cp "$HERE/flink/Dockerfile" "$HERE/flink/entrypoint.sh" "$CTX/flink/"
      cp -r "$DIST"/{bin,conf,lib,opt,plugins} "$CTX/flink/dist/"
      build flink flink:2.2.1-java17 "$CTX/flink" ;;
    python) build python python:3.11.11-slim-bookworm "$HERE/python" ;;
    maven) build maven maven:3.9.9-eclipse-temurin-17 "$HERE/maven" ;;
    *) echo "unknown stand-in: $name" >&2; exit 2 ;;
  esac
done
docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
  | grep -E '^(apache/kafka:4.1.1|redis:7.4.2|flink:2.2.1-java17|python:3.11.11-slim-bookworm|maven:3.9.9-eclipse-temurin-17) '
