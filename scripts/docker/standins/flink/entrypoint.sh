#!/bin/bash
# jobmanager | taskmanager | standalone-job [args] | any other command (run as is).
# jobmanager.rpc.address defaults to this host's name; each `key: value` line of FLINK_PROPERTIES is
# written into conf/config.yaml through Flink's own config parser.
set -euo pipefail
args=(-D"jobmanager.rpc.address=${JOB_MANAGER_RPC_ADDRESS:-$(hostname -f)}" -Dblob.server.port=6124)
[ -z "${TASK_MANAGER_NUMBER_OF_TASK_SLOTS:-}" ] || args+=(-D"taskmanager.numberOfTaskSlots=$TASK_MANAGER_NUMBER_OF_TASK_SLOTS")
while IFS= read -r line; do
  line=$(echo "$line" | tr -d '[:space:]')
  [ -n "$line" ] || continue
  args+=(-D"${line%%:*}=$(echo "${line#*:}" | envsubst)")
done <<< "${FLINK_PROPERTIES:-}"
"$FLINK_HOME/bin/config-parser-utils.sh" "$FLINK_HOME/conf" "$FLINK_HOME/bin" "$FLINK_HOME/lib" "${args[@]}" >/dev/null
case "${1:-help}" in
  jobmanager) shift; exec "$FLINK_HOME/bin/jobmanager.sh" start-foreground "$@" ;;
  taskmanager) shift; exec "$FLINK_HOME/bin/taskmanager.sh" start-foreground "$@" ;;
  standalone-job) shift; exec "$FLINK_HOME/bin/standalone-job.sh" start-foreground "$@" ;;
  help) echo "usage: (jobmanager|taskmanager|standalone-job|COMMAND...)"; exit 0 ;;
  *) exec "$@" ;;
esac
