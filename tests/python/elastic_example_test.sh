#!/usr/bin/env bash
# examples/python/elastic_train.py under hvdrun's elastic mode, disturbed from outside as a
# cluster would: 4 ranks on two names of this machine; once training is under way a rank on
# localhost is SIGKILLed (the job goes on with the 2 ranks of 127.0.0.1); then the discovery
# script lists [::1] too (the job grows to 4 ranks at its next commit). The example must
# reach its usual accuracy.
#
#   elastic_example_test.sh HVDRUN PYTHON EXAMPLE
set -uo pipefail
HVDRUN=$1 PY=$2 EXAMPLE=$3
DIR=$(mktemp -d /tmp/hvd_elastic_example.XXXXXX)
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
echo "127.0.0.1:2" >"$DIR/hosts"
echo "localhost:2" >>"$DIR/hosts"
printf '#!/bin/sh\ncat "%s"\n' "$DIR/hosts" >"$DIR/discover.sh"
chmod +x "$DIR/discover.sh"
timeout -k 5 240 "$HVDRUN" --verbose -np 4 --min-np 2 --max-np 4 \
  --host-discovery-script "$DIR/discover.sh" "$PY" "$EXAMPLE" --epochs 12 --epoch-sleep 0.5 \
  >"$DIR/out" 2>&1 &
JOB=$!
cleanup() { kill -9 "$JOB" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; cat "$DIR/out"; exit 1; }
# wait_for PATTERN SECONDS
wait_for() {
  local i
  for i in $(seq 1 $(($2 * 10))); do
    grep -qE -- "$1" "$DIR/out" && return 0
    kill -0 "$JOB" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
wait_for "epoch  2  ranks 4" 120 || fail "training did not start on 4 ranks"
victim=$(sed -n 's/^hvdrun: started worker localhost:1#[0-9]* (pid \([0-9]*\)).*/\1/p' "$DIR/out")
[ -n "$victim" ] || fail "no worker on localhost"
kill -9 "$victim"
wait_for "ranks 2  test" 60 || fail "the job did not go on with 2 ranks"
echo "[::1]:2" >>"$DIR/hosts"
wait_for "ranks 4  test" 90 || fail "the added host did not join"
wait "$JOB"
rc=$?
cat "$DIR/out"
[ $rc -eq 0 ] || fail "hvdrun exited $rc"
grep -qE "test_accuracy=0\.(9[0-9]|8[5-9])" "$DIR/out" || fail "accuracy below 0.85"
echo "ELASTIC-EXAMPLE-OK"
