#!/usr/bin/env bash
# The elastic tests: tests/python/elastic_job.py under hvdrun's elastic mode, on "hosts" that
# are names of this machine (127.0.0.1 and localhost: hvdrun treats each local name as a host).
#
#   elastic_test.sh HVDRUN PYTHON CASE
#     kill        4 ranks on 2 hosts; a rank is SIGKILLed mid-epoch; its host is blacklisted and
#                 the job ends on the other host's 2 ranks, with the same final model as a
#                 2-rank job started from the commit the survivors went on from; no sample lost
#     add         2 ranks; the discovery script gains a host mid-run; the job grows to 3 ranks
#     below-min   2 ranks, --min-np 2; one dies; hvdrun fails the job after --elastic-timeout,
#                 saying why
#     below-min-waits  2 ranks, --min-np 2; one dies; its host comes back from its cool-down
#                 before --elastic-timeout, and the job finishes in a new world of 2
#     blacklist   a host whose ranks die again and again is blacklisted each time, with a
#                 cool-down that doubles; the job still finishes
#     reset-limit --reset-limit 1: the first death gives a new world, the second ends the job,
#                 saying why
#     hung        a rank is SIGSTOPped: the others leave its world; hvdrun kills it once it has
#                 not left HVD_TIMEOUT_SECONDS + 5 s after them, and the job goes on without it
#     grow-from-one  1 rank, then a host is added: the DistributedOptimizer made in a world of
#                 one allreduces in the world of 2 (as Horovod's, in an elastic job)
#     state-lost  the only host holding the commit fails before the grown world hvdrun started
#                 workers for has formed: the job fails, saying why, instead of training the
#                 new workers from the initial state (elastic_edges.py)
#     sync-lost   the only worker holding the commit dies after the grown world formed, before
#                 its broadcast of the state reached the new worker: the job fails, saying
#                 why, instead of training the new worker from the initial state
#                 (elastic_edges.py)
#     late-host   a host appears after training ended: hvdrun stops the workers it started for
#                 it, and the job ends with 0 (elastic_edges.py)
#     remove-host  3 ranks on 2 hosts; the discovery script drops one host mid-run: its rank
#                 leaves with the others at their next commit (HostsUpdatedInterrupt), no step
#                 is rolled back, and the job finishes on 2 ranks (the rank was killed at once
#                 before, and the others rolled back to their last commit)
#     foreign-host  2 ranks; the discovery script gains a host that is not this machine, and the
#                 job has no --network-interface to reach it by: the host is blacklisted,
#                 saying why, and the job finishes on its 2 ranks (it was stopped before)
#     slow-discovery  a discovery script still running when the job ends is killed, and
#                 hvdrun's watchdog does not take the end for hvdrun's death
#     early-finish  rank 1 ends its loop at step 5 and exits 0 while rank 0 trains on: rank 0
#                 leaves its world and hears at once that none comes (a worker finished), the
#                 job ends non-zero naming both; it waited --elastic-timeout (600 s) before
#                 (elastic_edges.py)
#     internal-error  every rank raises HorovodInternalError with no peer lost: hvdrun forms
#                 the next world of the same workers at once and training goes on from the
#                 commit (elastic_edges.py); it waited for good before
set -uo pipefail
HVDRUN=$1
PY=$2
CASE=$3
JOB="$(cd "$(dirname "$0")" && pwd)/elastic_job.py"
EDGES="$(cd "$(dirname "$0")" && pwd)/elastic_edges.py"
DIR=$(mktemp -d /tmp/hvd_elastic.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1

fail() { echo "FAIL ($CASE): $*"; exit 1; }
# run LOG ARGS...: hvdrun with a bound on its time; output to LOG and to ours.
run() {
  local log=$1
  shift
  timeout -k 5 150 "$HVDRUN" "$@" >"$log" 2>&1
  local rc=$?
  cat "$log"
  return $rc
}
# discovery HOSTS: a discovery script that prints the file $DIR/hosts, which starts as HOSTS
# (the job's rank 0 appends to it, through HOSTS_FILE), and copies what it printed to
# $DIR/seen (SEEN_FILE: a job can wait until hvdrun has seen a host it added).
discovery() {
  echo "$1" >"$DIR/hosts"
  printf '#!/bin/sh\ncat "%s"\ncp "%s" "%s.tmp" && mv "%s.tmp" "%s"\n' "$DIR/hosts" \
    "$DIR/hosts" "$DIR/seen" "$DIR/seen" "$DIR/seen" >"$DIR/discover.sh"
  chmod +x "$DIR/discover.sh"
}
# state_lost SLOTS MODE: NP = SLOTS ranks on host 127.0.0.1; elastic_edges.py's MODE adds host
# localhost (SLOTS slots) and loses the workers holding the commit: the job must fail, saying
# so, and the new host's workers must not train from the initial state.
state_lost() {
  discovery "127.0.0.1:$1"
  HOSTS_FILE="$DIR/hosts" SEEN_FILE="$DIR/seen" run "$DIR/a.log" -np "$1" --min-np "$1" \
    --max-np $(($1 * 2)) --host-discovery-script "$DIR/discover.sh" "$PY" "$EDGES" --mode "$2" \
    --add-host "localhost:$1"
  [ $? -ne 0 ] || fail "hvdrun exited 0"
  grep -q "every worker that holds the committed state is gone" "$DIR/a.log" \
    || fail "hvdrun did not say the committed state was lost"
  if grep -q "EDGE-STEP host localhost" "$DIR/a.log"; then
    fail "the new host's workers trained from the initial state"
  fi
}
# grow_by_one SLOTS NP FLAGS...: NP ranks on host 127.0.0.1 (SLOTS slots); rank 0 adds host
# localhost (SLOTS slots) at step 5, and the job, whose FLAGS allow one rank more, grows to
# NP + 1 ranks without losing a sample.
grow_by_one() {
  local slots=$1 np=$2
  shift 2
  discovery "127.0.0.1:$slots"
  HOSTS_FILE="$DIR/hosts" run "$DIR/a.log" -np "$np" "$@" \
    --host-discovery-script "$DIR/discover.sh" "$PY" "$JOB" --epochs 3 --step-sleep 0.1 \
    --add-host "localhost:$slots" --add-at-step 5 || fail "the elastic job failed"
  grep -q "world 2: $((np + 1)) rank(s) (hosts changed), 1 new worker(s)" "$DIR/a.log" \
    || fail "the added host did not join"
  grep -q "ELASTIC-DONE size $((np + 1)) .* sizes \[$np, $((np + 1))\] lost 0 " "$DIR/a.log" \
    || fail "the job did not grow from $np to $((np + 1)) ranks without losing a sample"
}
same_params() {  # same_params A.json B.json: the final parameters agree to 1e-12
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
import numpy as np
a, b = (json.load(open(p)) for p in sys.argv[1:3])
pa, pb = np.array(a["params"]), np.array(b["params"])
diff = float(np.max(np.abs(pa - pb)))
print("final parameters: max |elastic - reference| = %g over %d values" % (diff, pa.size))
sys.exit(0 if pa.shape == pb.shape and diff <= 1e-12 else 1)
EOF
}

case "$CASE" in
  kill)
    run "$DIR/a.log" -np 4 --min-np 2 -H 127.0.0.1:2,localhost:2 "$PY" "$JOB" --epochs 2 \
      --die-worker 3 --die-at-step 17 --save-at-reset "$DIR/commit.pt" --out "$DIR/a.json" \
      || fail "the elastic job failed"
    grep -q "host localhost is blacklisted" "$DIR/a.log" || fail "no blacklisting"
    grep -q "ELASTIC-DONE size 2 .* sizes \[4, 2\] lost 0 repeated 0 resets 1" "$DIR/a.log" \
      || fail "the job did not end on 2 ranks with every sample once"
    [ -f "$DIR/commit.pt" ] || fail "no commit saved at the reset"
    run "$DIR/b.log" -np 2 --min-np 2 -H 127.0.0.1:2 "$PY" "$JOB" --epochs 2 \
      --resume "$DIR/commit.pt" --out "$DIR/b.json" || fail "the reference job failed"
    same_params "$DIR/a.json" "$DIR/b.json" || fail "final models differ"
    die=$(sed -n 's/.*ELASTIC-DIE worker 3 at step 17 t=\([0-9.]*\).*/\1/p' "$DIR/a.log")
    first=$(sed -n 's/.*ELASTIC-FIRST-STEP size 2 t=\([0-9.]*\).*/\1/p' "$DIR/a.log" | head -1)
    "$PY" -c "print('death to first step of the new world: %.3f s' % ($first - $die))"
    ;;
  add)
    grow_by_one 2 2 --max-np 3
    ;;
  remove-host)
    discovery "$(printf '127.0.0.1:2\nlocalhost:1')"
    HOSTS_FILE="$DIR/hosts" run "$DIR/a.log" -np 3 --min-np 2 \
      --host-discovery-script "$DIR/discover.sh" "$PY" "$JOB" --epochs 3 --step-sleep 0.1 \
      --batches-per-commit 4 --set-hosts "127.0.0.1:2" --set-at-step 6 \
      || fail "the elastic job failed"
    grep -q "the discovery script no longer lists the slot of worker localhost:0#2: it leaves" \
      "$DIR/a.log" || fail "hvdrun did not say the worker leaves at the next commit"
    grep -q "world 2: 2 rank(s) (hosts changed)" "$DIR/a.log" || fail "no world of 2"
    if grep -E -q "lost: |PeerLost|host [^ ]* is blacklisted" "$DIR/a.log"; then
      fail "the removal was handled as a failure"
    fi
    line=$(grep "ELASTIC-DONE" "$DIR/a.log")
    echo "$line" | grep -q "ELASTIC-DONE size 2 .* sizes \[3, 2\] lost 0 repeated 0 resets 1 " \
      || fail "the job did not go from 3 to 2 ranks with one reset and every sample once"
    steps=$(echo "$line" | sed -n 's/.* steps \([0-9]*\) .*/\1/p')
    ran=$(echo "$line" | sed -n 's/.* ran \([0-9]*\).*/\1/p')
    [ -n "$steps" ] && [ "$steps" = "$ran" ] ||
      fail "rank 0 ran $ran steps for $steps: a rollback redid some"
    ;;
  foreign-host)
    discovery "127.0.0.1:2"
    HOSTS_FILE="$DIR/hosts" run "$DIR/a.log" -np 2 --max-np 3 \
      --host-discovery-script "$DIR/discover.sh" "$PY" "$JOB" --epochs 2 --step-sleep 0.1 \
      --add-host "hvd-no-such-host.invalid:1" --add-at-step 5 || fail "the elastic job failed"
    grep -q "cannot start worker hvd-no-such-host.invalid:0#2: host hvd-no-such-host.invalid is not this machine: an elastic job with other hosts needs --network-interface.*; forming a new world without its host" \
      "$DIR/a.log" || fail "hvdrun did not say why the host could not join"
    grep -q "host hvd-no-such-host.invalid is blacklisted" "$DIR/a.log" || fail "no blacklisting"
    grep -q "ELASTIC-DONE size 2 .* lost 0 " "$DIR/a.log" \
      || fail "the job did not finish on its 2 ranks without losing a sample"
    ;;
  below-min)
    start=$(date +%s)
    run "$DIR/a.log" -np 2 --min-np 2 --elastic-timeout 3 -H 127.0.0.1:1,localhost:1 \
      "$PY" "$JOB" --epochs 3 --die-worker 1 --die-at-step 4
    rc=$?
    [ $rc -ne 0 ] || fail "hvdrun exited 0"
    grep -q "only 1 worker(s) left, fewer than --min-np 2, for 3 s (--elastic-timeout)" \
      "$DIR/a.log" || fail "hvdrun did not say why the job ended"
    [ $(($(date +%s) - start)) -lt 60 ] || fail "the job took too long to fail"
    ;;
  below-min-waits)
    # The dead worker's host comes back from its cool-down after 8 s: the job, below --min-np
    # meanwhile, waits for it (up to --elastic-timeout 60) and finishes in a world of 2. It
    # failed after about 4 s before, taking the survivor's leaving of the broken world for
    # worlds that never formed.
    run "$DIR/a.log" -np 2 --min-np 2 --elastic-timeout 60 --blacklist-cooldown-range 8 8 \
      -H 127.0.0.1:1,localhost:1 "$PY" "$JOB" --epochs 3 --die-worker 1 --die-at-step 4 \
      || fail "the elastic job failed"
    grep -q "fewer than --min-np 2; waiting up to 60 s (--elastic-timeout) for hosts" \
      "$DIR/a.log" || fail "hvdrun did not wait for hosts"
    grep -q "host localhost is back from its cool-down" "$DIR/a.log" \
      || fail "the host did not come back"
    grep -q "ELASTIC-DONE size 2 .* lost 0 " "$DIR/a.log" \
      || fail "the job did not finish in a world of 2"
    ;;
  blacklist)
    run "$DIR/a.log" -np 2 --min-np 1 -H 127.0.0.1:1,localhost:1 \
      --blacklist-cooldown-range 1 4 "$PY" "$JOB" --epochs 2 --min-resets 3 --max-epochs 60 \
      --step-sleep 0.05 \
      --die-on-host localhost --die-after 3 || fail "the elastic job failed"
    grep -q "host localhost is blacklisted for 1 s (failure 1 on it)" "$DIR/a.log" \
      || fail "no first blacklisting"
    grep -q "host localhost is blacklisted for 2 s (failure 2 on it)" "$DIR/a.log" \
      || fail "the cool-down did not double"
    grep -q "ELASTIC-DONE size 1 .* lost 0 " "$DIR/a.log" \
      || fail "the job did not finish on the healthy host"
    ;;
  reset-limit)
    run "$DIR/a.log" -np 3 --min-np 1 --reset-limit 1 -H "127.0.0.1:1,localhost:1,[::1]:1" \
      "$PY" "$JOB" --epochs 4 --die-worker 2 --die-at-step 4 --die-on-host localhost --die-after 8
    rc=$?
    [ $rc -ne 0 ] || fail "hvdrun exited 0"
    grep -q "world 2: 2 rank(s)" "$DIR/a.log" || fail "the first death did not give a new world"
    grep -q "but --reset-limit 1 is reached; stopping the job" "$DIR/a.log" \
      || fail "hvdrun did not say the reset limit ended the job"
    ;;
  hung)
    run "$DIR/a.log" -np 3 --min-np 2 --timeout 3 -H 127.0.0.1:2,localhost:1 "$PY" "$JOB" \
      --stop-worker 2 --stop-at-step 10 || fail "the elastic job failed"
    grep -q "worker localhost:0#2 has not left world 1 8 s after" "$DIR/a.log" \
      || fail "hvdrun did not find the stopped worker"
    grep -q "ELASTIC-DONE size 2 .* sizes \[3, 2\] lost 0 " "$DIR/a.log" \
      || fail "the job did not go on without the stopped worker"
    ;;
  grow-from-one)
    grow_by_one 1 1 --min-num-proc 1 --max-num-proc 2
    ;;
  state-lost)
    state_lost 2 state-lost
    ;;
  sync-lost)
    state_lost 1 sync-lost
    grep -q "EDGE-HOLDER-DIES" "$DIR/a.log" || fail "the first worker did not die in its reset"
    ;;
  late-host)
    discovery "127.0.0.1:1"
    start=$(date +%s)
    HOSTS_FILE="$DIR/hosts" SEEN_FILE="$DIR/seen" run "$DIR/a.log" -np 1 --min-np 1 \
      --max-np 2 --host-discovery-script "$DIR/discover.sh" "$PY" "$EDGES" --mode late-host \
      --add-host localhost:1 || fail "the finished job did not end with 0"
    grep -q "EDGE-DONE rank 0 step 5" "$DIR/a.log" || fail "training did not finish"
    grep -q "world 2: 2 rank(s) (hosts changed), 1 new worker(s)" "$DIR/a.log" \
      || fail "hvdrun did not start a worker for the added host"
    grep -q "stopping worker localhost:0#1 (training finished before the world it was" \
      "$DIR/a.log" || fail "hvdrun did not stop the worker of the world that never formed"
    [ $(($(date +%s) - start)) -lt 60 ] || fail "the job took too long to end"
    ;;
  internal-error)
    start=$(date +%s)
    run "$DIR/a.log" -np 2 --min-np 2 -H 127.0.0.1:2 "$PY" "$EDGES" --mode internal-error \
      || fail "the elastic job failed"
    grep -q "world 2: 2 rank(s) (every worker left world 1" "$DIR/a.log" \
      || fail "hvdrun did not form the next world"
    [ "$(grep -c "EDGE-DONE rank [01] step 10 attempts 2" "$DIR/a.log")" = 2 ] \
      || fail "training did not go on from the commit in the new world"
    [ $(($(date +%s) - start)) -lt 30 ] || fail "the job took too long (hvdrun waited)"
    ;;
  early-finish)
    start=$(date +%s)
    run "$DIR/a.log" -np 2 --min-np 1 --max-np 2 -H 127.0.0.1:2 "$PY" "$EDGES" \
      --mode early-finish && fail "a job whose workers ended at different steps ended with 0"
    grep -q "EDGE-DONE rank 1 step 5" "$DIR/a.log" || fail "rank 1 did not finish at step 5"
    grep -q "no new world will form: worker 127.0.0.1:[01]#[01] (rank 1 of world 1) finished" \
      "$DIR/a.log" || fail "rank 0 was not told that a worker finished"
    grep -q "hvdrun: worker 0 (pid [0-9]*) exited with code 1" "$DIR/a.log" \
      || fail "hvdrun did not name the worker still training"
    [ $(($(date +%s) - start)) -lt 60 ] || fail "the job took too long to end (it waited)"
    ;;
  slow-discovery)
    # A discovery script that takes 0.7 s is mostly running when the job ends: hvdrun kills
    # it and exits 0, and its watchdog must stay quiet. It said "hvdrun ... is gone; stopping
    # the processes its ranks left" in most such jobs (the killed script's processes were not
    # yet reaped when it looked), as if hvdrun had died.
    printf '#!/bin/sh\nsleep 0.7\necho 127.0.0.1:2\n' >"$DIR/slow.sh"
    chmod +x "$DIR/slow.sh"
    for i in 1 2 3 4; do
      run "$DIR/a.log" -np 2 --min-np 2 --max-np 2 --host-discovery-script "$DIR/slow.sh" \
        "$PY" "$JOB" --epochs 1 --step-sleep 0.05 || fail "the elastic job failed"
      grep -q "ELASTIC-DONE size 2 " "$DIR/a.log" || fail "training did not finish"
      sleep 1.5  # the watchdog speaks within a tick of hvdrun's end
      ! grep -q "is gone" "$DIR/a.log" || fail "the watchdog took a finished job for a dead hvdrun"
    done
    ;;
  *)
    fail "unknown case"
    ;;
esac
echo "ELASTIC-TEST-OK $CASE"
