#!/usr/bin/env bash
# The compose stack, end to end, in a real Docker engine: build the images, bring the stack up, wait
# until events flow, features are in Redis, samples reach the trainer and a snapshot is promoted; read a
# feature and score items from the host with scripts/rtrec; stop the trainer with SIGTERM and check that
# it resumes from its snapshot; restart the jobmanager and check that the job comes back from its
# checkpoint; tear everything down. Prints what it checked and how long each step took.
#
# Not part of the README's test command: it needs a Docker engine and ~15 GB of images. Run it before
# every change to docker-compose.yml or the Dockerfiles.
#
# Usage: scripts/compose-smoke.sh [--standins] [--secure] [--keep] [--compose "docker compose"|docker-compose]
#   --standins  first build offline stand-ins for the official base images (air-gapped machines;
#               scripts/docker/build-standins.sh, which needs a local debian:bookworm-slim image)
#   --secure    the secured stack (docker-compose.secure.yml, credentials of its own made by
#               scripts/compose-secure-init.sh); the host clients connect with them, and it checks as well
#               that plain clients are refused and that no password is in any log or container config
#   --keep      leave the stack running at the end (default: `down -v`, volumes included)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STANDINS=0 SECURE=0 KEEP=0 COMPOSE=""
while [ $# -gt 0 ]; do
  case $1 in
    --standins) STANDINS=1 ;;
    --secure) SECURE=1 ;;
    --keep) KEEP=1 ;;
    --compose) COMPOSE=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$COMPOSE" ]; then
  if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE=docker-compose; fi
fi
[ -x .venv/bin/python ] || scripts/bootstrap.sh

# The stack under its own project name and snapshot directory, beside anything the user runs.
export COMPOSE_PROJECT_NAME=rtrec-smoke RTREC_UID=$(id -u) RTREC_GID=$(id -g)
SNAPSHOTS=$(mktemp -d "$ROOT/.compose-data/smoke-snapshots.XXXX")
export RTREC_SNAPSHOTS_DIR=$SNAPSHOTS
# scripts/rtrec on the host, pointed at the stack's published ports
HOST_ENV=(RTREC_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:${RTREC_KAFKA_PORT:-29092}
          RTREC_REDIS__URL=redis://127.0.0.1:${RTREC_REDIS_PORT:-26379}/0 RTREC_TRAINER__SNAPSHOT_DIR=$SNAPSHOTS)
REDIS_CLI=(redis-cli -p "${RTREC_REDIS_PORT:-26379}")
if [ $SECURE = 1 ]; then
  export RTREC_SECURE_DIR=$(mktemp -d "$ROOT/.compose-data/smoke-secure.XXXX")
  export COMPOSE_FILE=docker-compose.yml:docker-compose.secure.yml
  scripts/compose-secure-init.sh >/dev/null
  HOST_ENV+=(RTREC_REDIS__URL=rediss://127.0.0.1:${RTREC_REDIS_PORT:-26379}/0 RTREC_REDIS__USERNAME=rtrec
             RTREC_REDIS__PASSWORD_FILE=$RTREC_SECURE_DIR/redis-user.password
             RTREC_REDIS__SSL_CA_FILE=$RTREC_SECURE_DIR/ca.pem
             RTREC_KAFKA__SECURITY__PROTOCOL=SASL_SSL RTREC_KAFKA__SECURITY__SASL_MECHANISM=PLAIN
             RTREC_KAFKA__SECURITY__USERNAME=rtrec
             RTREC_KAFKA__SECURITY__PASSWORD_FILE=$RTREC_SECURE_DIR/kafka-user.password
             RTREC_KAFKA__SECURITY__SSL_CA_FILE=$RTREC_SECURE_DIR/ca.pem)
  REDIS_CLI+=(--tls --cacert "$RTREC_SECURE_DIR/ca.pem" --user rtrec --no-auth-warning)
  REDISCLI_AUTH=$(cat "$RTREC_SECURE_DIR/redis-user.password")  # read by redis-cli, not on its command line
  export REDISCLI_AUTH
fi
FLINK_UI=http://127.0.0.1:${RTREC_FLINK_UI_PORT:-28081}
rtrec() { env "${HOST_ENV[@]}" scripts/rtrec "$@"; }
dc() { $COMPOSE "$@"; }

T0=$SECONDS STEP_T=$SECONDS
trap finish EXIT
step() { STEP_T=$SECONDS; echo "--- $*"; }
ok() { printf '    ok (%d s; %d s in all): %s\n' $((SECONDS - STEP_T)) $((SECONDS - T0)) "$*"; }
PASSED=0
fail() {
  echo "FAILED: $*" >&2
  dc ps >&2 || true
  dc logs --tail 25 2>&1 | grep -v -e 'checkpoint' -e 'TransactionManager' -e 'Flushing new partitions' -e 'Name collision' >&2 || true
  exit 1
}
finish() {
  local code=$?
  [ $PASSED = 1 ] || echo "compose smoke FAILED (exit $code) after $((SECONDS - T0)) s" >&2
  if [ $KEEP = 0 ]; then
    dc down -v --remove-orphans >/dev/null 2>&1 || true
    rm -rf "$SNAPSHOTS" "${RTREC_SECURE_DIR:-}"
  fi
}
wait_until() {  # timeout_s description command...
  local timeout=$1 what=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$what: not within $timeout s"
    sleep 3
  done
}
topic_end() {  # the sum of a topic's high watermarks, read from the host listener
  env "${HOST_ENV[@]}" PYTHONPATH=. .venv/bin/python - "$1" <<'EOF'
import sys
from confluent_kafka import Consumer, TopicPartition
from core.settings import load_settings
s = load_settings()
c = Consumer({"bootstrap.servers": s.kafka.bootstrap_servers, "group.id": "rtrec-smoke-probe",
              **s.kafka.security.librdkafka()})
meta = c.list_topics(sys.argv[1], timeout=10).topics[sys.argv[1]]
print(sum(c.get_watermark_offsets(TopicPartition(sys.argv[1], p), timeout=10)[1] for p in (meta.partitions or {})))
c.close()
EOF
}
grows() { local a b; a=$(topic_end "$1") || return 1; sleep 5; b=$(topic_end "$1") || return 1; [ "$b" -gt "$a" ]; }
current_version() { rtrec model list 2>/dev/null | awk '$1 == "*" {print $2}'; }
newest_version() { rtrec model list 2>/dev/null | awk 'NR > 1 {v = $1 == "*" ? $2 : $1} END {print v}'; }
healthy() { [ "$(docker inspect -f '{{.State.Health.Status}}' "$(dc ps -q "$1")")" = healthy ]; }
redis_user() { { "${REDIS_CLI[@]}" --scan --pattern 'rtrec:f:user:*' || true; } | head -1 | cut -d: -f4; }
has_user_features() { [ -n "$(redis_user)" ]; }
promoted() { [ -n "$(current_version)" ]; }
newer_than() { local v; v=$(newest_version); [ -n "$v" ] && [ "$v" -gt "$1" ]; }
logged() { dc logs "$1" 2>&1 | grep -q "$2"; }
past() { local n; n=$(topic_end "$1") && [ "$n" -gt "$2" ]; }
job_state() { curl -sf "$FLINK_UI/jobs/overview" | .venv/bin/python -c \
  "import json,sys; print(' '.join(j['state'] for j in json.load(sys.stdin)['jobs'] if j['name'] == 'rtrec-features'))"; }
job_running() { job_state | grep -qw RUNNING; }

echo "compose: $($COMPOSE version --short 2>/dev/null || $COMPOSE version | head -1); engine: $(docker version --format '{{.Server.Version}}')"
if [ $STANDINS = 1 ]; then
  step "offline stand-ins for the base images"
  scripts/docker/build-standins.sh
  ok "stand-ins present"
fi

step "build the images"
dc build -q 2>&1 | grep -v -e '^\s*$' -e 'legacy builder is deprecated' -e 'buildx component' -e 'docs.docker.com/go/buildx' || true
for image in rtrec-app:0.1.0 rtrec-flink:0.1.0; do
  docker image inspect "$image" >/dev/null || fail "$image was not built"
  echo "    $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.2f GB", $1/1e9}')"
done
ok "images built"

step "up"
dc up -d 2>&1 | grep -v -e '^Creating' -e '^Starting' -e '^ *Container' -e '^ *Network' -e '^ *Volume' -e '^\s*$' || true
ok "$COMPOSE up -d returned"

step "Kafka and Redis healthy, the feature job running"
wait_until 180 "Kafka healthy" healthy kafka
wait_until 60 "Redis healthy" healthy redis
wait_until 300 "the feature job RUNNING on the Flink cluster" job_running
ok "job $(job_state) (Flink UI $FLINK_UI)"

step "events flow into Kafka, features and samples out of the job"
wait_until 120 "events on rtrec.interactions" grows rtrec.interactions
wait_until 300 "feature records on rtrec.features" grows rtrec.features
wait_until 300 "samples on rtrec.samples" grows rtrec.samples
ok "events $(topic_end rtrec.interactions), feature records $(topic_end rtrec.features), samples $(topic_end rtrec.samples)"

step "features in Redis, read from the host"
wait_until 180 "user features in Redis" has_user_features
USER_ID=$(redis_user)
FEATURES=$(rtrec features get user "$USER_ID")
echo "    $FEATURES"
echo "$FEATURES" | grep -q '"features"' || fail "no features for $USER_ID"
ok "scripts/rtrec features get user $USER_ID"

step "a snapshot promoted, scored from the host"
wait_until 600 "a promoted snapshot" promoted
FIRST=$((SECONDS - T0))
rtrec model list | sed 's/^/    /'
SCORES=$(rtrec model score --user "$USER_ID" --items i1,i2,i3)
echo "$SCORES" | sed 's/^/    /'
[ "$(echo "$SCORES" | grep -c $'^i[123]\t')" = 3 ] || fail "scoring did not return three items"
ok "first promoted snapshot ${FIRST} s after the start; scripts/rtrec model score"

step "SIGTERM to the trainer: a final snapshot, then a resume from it"
BEFORE=$(current_version)
dc stop -t 90 trainer >/dev/null 2>&1
CODE=$(docker inspect -f '{{.State.ExitCode}}' "$(dc ps -a -q trainer)")
[ "$CODE" = 0 ] || fail "the trainer exited $CODE after SIGTERM"
dc logs trainer 2>&1 | grep -q "SIGTERM received" || fail "the trainer did not see SIGTERM"
# its last words: "trained N samples, ..., snapshots [.., LAST], ..." (the final snapshot included)
LAST=$(dc logs trainer 2>&1 | grep -o 'trained [0-9]* samples.*snapshots \[[0-9, ]*\]' | tail -1 | grep -o '[0-9]*\]$' | tr -d ']')
[ -n "$LAST" ] && [ "$LAST" = "$(newest_version)" ] || fail "no final snapshot after SIGTERM (last words: $LAST)"
dc start trainer >/dev/null 2>&1
wait_until 180 "the trainer resumed" logged trainer "resumed from snapshot v$LAST:"
wait_until 300 "a snapshot after the restart" newer_than "$LAST"
ok "exit 0 after SIGTERM; promoted v$BEFORE before, final v$LAST, resumed from v$LAST and went on"

if [ $SECURE = 1 ]; then
  step "secured: plain clients refused, no password in any log or container configuration"
  env PYTHONPATH=. .venv/bin/python - "127.0.0.1:${RTREC_KAFKA_PORT:-29092}" <<'EOF' || fail "a plain Kafka client was served"
import sys
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
try:
    AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=5)
except KafkaException:
    sys.exit(0)
sys.exit(1)
EOF
  ! redis-cli -p "${RTREC_REDIS_PORT:-26379}" ping >/dev/null 2>&1 || fail "Redis answered a client without TLS"
  PASSWORDS=$(mktemp)
  cat "$RTREC_SECURE_DIR"/*.password > "$PASSWORDS"
  LEAKS=$({ dc logs 2>&1; docker inspect $(dc ps -q); } | grep -c -F -f "$PASSWORDS" || true)
  rm -f "$PASSWORDS"
  [ "$LEAKS" = 0 ] || fail "$LEAKS lines of the logs or container configurations hold a password"
  ok "plain Kafka and Redis clients refused; no password in $(dc logs 2>&1 | wc -l) log lines nor in docker inspect"
fi

step "jobmanager restart: the keeper resubmits the job from its newest checkpoint"
dc restart jobmanager >/dev/null 2>&1
wait_until 300 "the job resubmitted" logged job-keeper "resuming from checkpoint"
wait_until 300 "the job RUNNING again" job_running
AFTER=$(topic_end rtrec.features)
wait_until 300 "feature records after the restart" past rtrec.features "$AFTER"
ok "$(dc logs job-keeper 2>&1 | grep -o 'resuming from checkpoint .*' | tail -1); features go on past $AFTER"

step "down"
if [ $KEEP = 1 ]; then
  ok "kept running (COMPOSE_PROJECT_NAME=$COMPOSE_PROJECT_NAME; $COMPOSE down -v to remove)"
else
  dc down -v --remove-orphans >/dev/null 2>&1
  ok "stack and volumes removed"
fi
PASSED=1
echo "compose smoke passed in $((SECONDS - T0)) s"
