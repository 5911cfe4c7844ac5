#!/usr/bin/env bash
# Random kills (docs/RELIABILITY.md): TRIALS times, start a 4-rank job under hvdrun
# (mp_collectives_worker --chaos: start, negotiation, 4 MiB collectives, shutdown), wait a random
# time, then SIGKILL a random rank; then STOP_TRIALS more trials that SIGSTOP it. A trial passes
# when
#   - hvdrun exits within max(HVD_TIMEOUT_SECONDS, HVD_START_TIMEOUT) + grace + 10 s (no hang),
#     non-zero unless the job had already finished, naming the victim for a kill;
#   - every survivor either finished or printed an error naming the victim ("rank V", or V in a
#     "ranks [...]" list);
#   - no process of the trial is left afterwards (no orphan).
# Prints one line per trial and a table by the phase the victim was in when it was signalled.
#   TRIALS=100 STOP_TRIALS=20 NP=4 scripts/chaos.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
TRIALS=${TRIALS:-100}
STOP_TRIALS=${STOP_TRIALS:-20}
NP=${NP:-4}
TIMEOUT=${CHAOS_TIMEOUT:-5}
# A rank killed before the job has formed is found by the start timeout: the survivors are still
# waiting for its address or its connection. The grace period outlasts it so they can report.
START=${CHAOS_START_TIMEOUT:-8}
GRACE=${CHAOS_GRACE:-12}
MAX_DELAY_MS=${MAX_DELAY_MS:-1200}
HVDRUN="$BUILD_DIR/bin/hvdrun"
WORKER="$BUILD_DIR/bin/mp_collectives_worker"
BOUND=$(( (TIMEOUT > START ? TIMEOUT : START) + GRACE + 10 ))
work=$(mktemp -d /tmp/hvd_chaos.XXXXXX)
trap 'rm -rf "$work"' EXIT

declare -A phase_trials phase_fail
fails=0 hangs=0 orphans=0 unnamed=0 misses=0
total=$((TRIALS + STOP_TRIALS))
for ((trial = 1; trial <= total; ++trial)); do
  sig=KILL
  ((trial > TRIALS)) && sig=STOP
  out="$work/trial$trial.log"
  victim=$((RANDOM % NP))
  # A quarter of the trials signal the victim as soon as it has started (job formation), an
  # eighth as soon as it says it is shutting down, the rest at a uniform moment of the job.
  delay_ms=$((RANDOM % MAX_DELAY_MS))
  at_shutdown=0
  case $((RANDOM % 8)) in
    0|1) delay_ms=0 ;;
    2) delay_ms=0; at_shutdown=1 ;;
  esac
  # A marker in the command line finds this trial's processes, however they were re-parented.
  marker="--chaos-trial=$$-$trial"
  setsid "$HVDRUN" -np "$NP" --timeout "$TIMEOUT" --start-timeout "$START" --grace-seconds "$GRACE" \
    "$WORKER" --chaos "$marker" > "$out" 2>&1 &
  hp=$!
  start=$(date +%s%N)
  sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
  # The victim's pid, once it has started (a kill "during start" may wait for it briefly).
  pid=""
  for _ in $(seq 1 200); do
    pid=$(sed -n "s/^\[$victim\]<stdout>:CHAOS-PID rank $victim pid \([0-9]*\)$/\1/p" "$out" | head -1)
    [ -n "$pid" ] && break
    sleep 0.01
  done
  if ((at_shutdown)); then
    for _ in $(seq 1 1000); do
      grep -q "CHAOS-SHUTDOWN rank $victim\$" "$out" && break
      kill -0 "$hp" 2>/dev/null || break
      sleep 0.005
    done
  fi
  phase=start
  grep -q "CHAOS-READY rank $victim\$" "$out" && phase=running
  grep -q "CHAOS-SHUTDOWN rank $victim\$" "$out" && phase=shutdown
  grep -q "CHAOS-DONE rank $victim\$" "$out" && phase=finished
  [ -n "$pid" ] && kill -s "$sig" "$pid" 2>/dev/null
  waited=0
  while kill -0 "$hp" 2>/dev/null && ((waited < BOUND * 10)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  verdict=ok
  why=""
  if kill -0 "$hp" 2>/dev/null; then
    # A victim stopped after its work was done never exits, and hvdrun, like any launcher,
    # waits for every rank to exit: not a hang of hvd's. Any other trial still running is one.
    if [ "$phase" != finished ]; then
      verdict=FAIL
      why="hvdrun still running after ${BOUND} s"
      hangs=$((hangs + 1))
    fi
    kill -KILL -- -"$hp" 2>/dev/null
    pkill -KILL -f -- "$marker"
  fi
  wait "$hp" 2>/dev/null
  rc=$?
  seconds=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$phase" = finished ] || [ -z "$pid" ]; then
    misses=$((misses + 1))
  else
    if [ "$rc" -eq 0 ] && ! grep -q "CHAOS-DONE rank" "$out"; then
      verdict=FAIL; why="$why hvdrun exited 0 after a $sig"
    fi
    if [ "$sig" = KILL ] && [ "$rc" -ne 0 ] &&
       ! grep -q "hvdrun: rank $victim (pid $pid) was killed by signal 9" "$out"; then
      verdict=FAIL; why="$why hvdrun did not name rank $victim"
      unnamed=$((unnamed + 1))
    fi
    for ((r = 0; r < NP; ++r)); do
      ((r == victim)) && continue
      if grep -q "^\[$r\]<stdout>:CHAOS-DONE rank $r\$" "$out"; then continue; fi
      err=$(grep "^\[$r\]<stdout>:CHAOS-ERROR rank $r:" "$out" | head -1)
      if [ -z "$err" ]; then
        verdict=FAIL; why="$why rank $r reported nothing"
        unnamed=$((unnamed + 1))
      elif ! echo "$err" | grep -Eq "rank $victim([^0-9]|\$)|ranks \[([0-9]+, )*$victim(, [0-9]+)*\]"; then
        verdict=FAIL; why="$why rank $r's error does not name rank $victim: ${err#*CHAOS-ERROR }"
        unnamed=$((unnamed + 1))
      fi
    done
  fi
  sleep 0.2
  left=$(pgrep -f -- "$marker" | wc -l)
  if [ "$left" -gt 0 ]; then
    verdict=FAIL; why="$why $left processes left"
    orphans=$((orphans + left))
    pkill -KILL -f -- "$marker"
  fi
  key="$sig/$phase"
  phase_trials[$key]=$(( ${phase_trials[$key]:-0} + 1 ))
  if [ "$verdict" != ok ]; then
    phase_fail[$key]=$(( ${phase_fail[$key]:-0} + 1 ))
    fails=$((fails + 1))
    cp "$out" "/tmp/hvd_chaos_failed_trial$trial.log"
  fi
  printf 'trial %3d: SIG%-4s rank %d at %4d ms (%-8s) hvdrun rc %3d after %5d ms: %s%s\n' \
    "$trial" "$sig" "$victim" "$delay_ms" "$phase" "$rc" "$seconds" "$verdict" "${why:+ -$why}"
done
echo
printf '%-16s %7s %7s\n' "signal/phase" trials failed
for key in $(printf '%s\n' "${!phase_trials[@]}" | sort); do
  printf '%-16s %7d %7d\n' "$key" "${phase_trials[$key]}" "${phase_fail[$key]:-0}"
done
echo "trials $total: $fails failed, $hangs hangs, $orphans orphans, $unnamed survivors not naming the victim, $misses after the job had finished (not counted)"
[ "$fails" -eq 0 ]
