#!/bin/bash
# The compose stack's job submitter: keeps the feature job running on the session cluster. A session
# cluster without HA forgets its jobs when the jobmanager restarts, and a job whose restarts are used up
# ends FAILED; either way the job is submitted again, resuming from the newest retained checkpoint on the
# shared volume, so its state and its exactly-once output survive. Asks the REST API every CHECK_EVERY_S.
set -uo pipefail
REST=${FLINK_REST_URL:-http://jobmanager:8081}
JOB=/opt/rtrec/flink_jobs/submit.py
while true; do
  python "$JOB" --running-on "$REST"
  case $? in
    0) ;;
    1) echo "[keeper] $REST runs no feature job: submitting (resuming from the newest retained checkpoint)"
       flink run -d -m "${REST#*://}" -pyclientexec python -pyexec python -py "$JOB" --resume \
         || echo "[keeper] submission failed (exit $?); trying again in ${CHECK_EVERY_S:-15} s" ;;
    *) echo "[keeper] $REST does not answer; asking again in ${CHECK_EVERY_S:-15} s" ;;
  esac
  sleep "${CHECK_EVERY_S:-15}"
done
