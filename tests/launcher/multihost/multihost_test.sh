#!/usr/bin/env bash
# Multi-host hvdrun tests on fake hosts (tests/netns/netns_hosts.sh): hvdrun runs on the
# launcher namespace (10.233.0.1) and reaches hosts 10.233.0.11 and .12 over ssh.
#
#   multihost_test.sh CASE HVDRUN WORKER
#
# CASE is one of:
#   collectives  -np 4 over 2 hosts: allreduce/allgather/broadcast checked by the worker;
#                placement and addresses; prints the time from hvdrun's start to the first
#                collective
#   hostfile     --hostfile with this host plus 2 remote hosts and --network-interface eth0
#   unreachable  a host nobody answers on, a key the hosts refuse, an interface that is not
#                there: clear errors within --start-timeout, nothing started
#   remotekill   SIGKILL to a rank on a remote host: everything stops, hvdrun exits 137 naming
#                it; the job's secret was on no command line
#   interrupt    SIGINT to hvdrun, then SIGKILL to hvdrun: the remote ranks go away
# After every job no process but sshd's listener is left in the host namespaces.
# Exit 0: pass; 77: skipped (no namespaces here); anything else: fail.
set -u

CASE=$1 HVDRUN=$2 WORKER=$3
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../../netns/netns_hosts.sh"

FAILED=0
fail() { echo "FAIL: $*"; FAILED=1; }
has() { grep -qE -- "$2" "$1"; }

netns_hosts_up 2 || { echo "FAIL: cannot set up the fake hosts"; exit 1; }
H1=${NETNS_ADDR[1]} H2=${NETNS_ADDR[2]}
SSH_FLAGS=(--ssh-config "$NETNS_SSH_CONFIG" -i "$NETNS_SSH_KEY" -p "$NETNS_SSH_PORT")
OUT=$NETNS_DIR/out ERR=$NETNS_DIR/err
cd "$NETNS_DIR" || exit 1

# start_job ARGS...: hvdrun in the background on the launcher host; JOB is its pid.
start_job() {
  START_MS=$(date +%s%3N)
  ip netns exec "$NETNS_L" "$HVDRUN" "$@" > "$OUT" 2> "$ERR" &
  JOB=$!
}

# wait_job SECONDS: waits (bounded) for hvdrun; RC is its exit code, -1 when it had to be
# killed; ELAPSED_MS is the time since start_job.
wait_job() {
  local i
  for i in $(seq 1 $(($1 * 10))); do
    kill -0 "$JOB" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$JOB" 2>/dev/null; then
    fail "hvdrun did not exit within $1 s"
    kill -KILL "$JOB"; wait "$JOB"; RC=-1
  else
    wait "$JOB"; RC=$?
  fi
  ELAPSED_MS=$(( $(date +%s%3N) - START_MS ))
}

show() { echo "--- stdout"; cat "$OUT"; echo "--- stderr"; cat "$ERR"; echo "---"; }

# no_leftovers: within 10 s, nothing but sshd's listener runs on the hosts.
no_leftovers() {
  local i left=""
  for i in $(seq 1 100); do
    left="$(netns_leftovers 1) $(netns_leftovers 2)"
    [ -z "${left// /}" ] && return 0
    sleep 0.1
  done
  fail "processes left on the hosts:"; ps -o pid,ppid,pgid,args -p "${left// /,}"
}

# wait_pid_files DIR N: until N files pid.0..pid.N-1 exist (at most 60 s).
wait_pid_files() {
  local i r n
  for i in $(seq 1 600); do
    n=0
    for r in $(seq 0 $(($2 - 1))); do [ -s "$1/pid.$r" ] && n=$((n + 1)); done
    [ "$n" = "$2" ] && return 0
    kill -0 "$JOB" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

case_collectives() {
  start_job "${SSH_FLAGS[@]}" -np 4 -H "$H1:2,$H2:2" "$WORKER"
  wait_job 90
  [ "$RC" = 0 ] || fail "hvdrun exited $RC"
  [ "$(grep -c '^\[[0-3]\]<stdout>:CHECKS-OK rank' "$OUT")" = 4 ] || fail "not every rank checked OK"
  local want
  for want in "\[0\]<stdout>:WHO rank 0 size 4 local 0/2 cross 0/2 host $H1 bind $H1 " \
              "\[1\]<stdout>:WHO rank 1 size 4 local 1/2 cross 0/2 host $H1 bind $H1 " \
              "\[2\]<stdout>:WHO rank 2 size 4 local 0/2 cross 1/2 host $H2 bind $H2 " \
              "\[3\]<stdout>:WHO rank 3 size 4 local 1/2 cross 1/2 host $H2 bind $H2 "; do
    has "$OUT" "$want" || fail "missing: $want"
  done
  local first
  first=$(sed -n 's/.*FIRST-COLLECTIVE-UNIX-MS \([0-9]*\).*/\1/p' "$OUT")
  [ -n "$first" ] && echo "MEASURE hvdrun start to first collective, 4 ranks on 2 ssh hosts: $((first - START_MS)) ms (whole job $ELAPSED_MS ms)"
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

case_hostfile() {
  printf '# launcher host, then two remote hosts\nlocalhost slots=1\n%s slots=2\n\n%s slots=1\n' \
    "$H1" "$H2" > "$NETNS_DIR/hosts"
  start_job "${SSH_FLAGS[@]}" --hostfile "$NETNS_DIR/hosts" --network-interface eth0 "$WORKER"
  wait_job 90
  [ "$RC" = 0 ] || fail "hvdrun exited $RC"
  [ "$(grep -c 'CHECKS-OK rank' "$OUT")" = 4 ] || fail "not every rank checked OK"
  local want
  for want in "\[0\]<stdout>:WHO rank 0 size 4 local 0/1 cross 0/3 host localhost bind 10.233.0.1 " \
              "\[1\]<stdout>:WHO rank 1 size 4 local 0/2 cross 1/3 host $H1 bind $H1 " \
              "\[2\]<stdout>:WHO rank 2 size 4 local 1/2 cross 0/1 host $H1 bind $H1 " \
              "\[3\]<stdout>:WHO rank 3 size 4 local 0/1 cross 2/3 host $H2 bind $H2 "; do
    has "$OUT" "$want" || fail "missing: $want"
  done
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

case_unreachable() {
  # Nobody has 10.233.0.99: ssh's connect times out (or finds no route) within the timeout.
  start_job "${SSH_FLAGS[@]}" --start-timeout 3 -H "$H1:2,10.233.0.99:2" "$WORKER"
  wait_job 30
  [ "$RC" = 1 ] || fail "unreachable host: hvdrun exited $RC, expected 1"
  [ "$ELAPSED_MS" -lt 6000 ] || fail "unreachable host: took $ELAPSED_MS ms with --start-timeout 3"
  has "$ERR" "host 10.233.0.99 failed the ssh check: .*(port $NETNS_SSH_PORT|no answer)" ||
    fail "unreachable host not named with ssh's message"
  has "$ERR" "host $H1 failed" && fail "reachable host $H1 reported"
  has "$ERR" "1 of 2 remote host\(s\) cannot be used; no rank was started" || fail "no summary"
  has "$OUT" "<stdout>" && fail "a rank started"
  [ "$FAILED" = 0 ] || show
  echo "unreachable host reported after $ELAPSED_MS ms"

  # A key the hosts do not accept: both named, each with ssh's "Permission denied".
  ssh-keygen -q -t ed25519 -N '' -f "$NETNS_DIR/stranger_key"
  start_job --ssh-config "$NETNS_SSH_CONFIG" -i "$NETNS_DIR/stranger_key" -p "$NETNS_SSH_PORT" \
    --start-timeout 10 -H "$H1:1,$H2:1" "$WORKER"
  wait_job 30
  [ "$RC" = 1 ] || fail "refused key: hvdrun exited $RC"
  for h in "$H1" "$H2"; do
    has "$ERR" "host $h failed the ssh check: .*Permission denied \(publickey\)" ||
      fail "refused key: $h not reported with ssh's message"
  done
  [ "$FAILED" = 0 ] || show

  # An interface the hosts do not have.
  start_job "${SSH_FLAGS[@]}" --network-interface eth9 -H "$H1:1,$H2:1" "$WORKER"
  wait_job 30
  [ "$RC" = 1 ] || fail "missing interface: hvdrun exited $RC"
  has "$ERR" "host $H2 failed the ssh check: no IPv4 address on interface eth9" ||
    fail "missing interface not reported"
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

# The secret of the running job (from rank 0's environment) must be on no command line.
check_secret_not_in_argv() {
  local pid=$1 secret
  secret=$(tr '\0' '\n' < "/proc/$pid/environ" | sed -n 's/^HVD_SECRET=//p')
  [ "${#secret}" = 64 ] || { fail "rank 0 has no HVD_SECRET"; return; }
  # Matched with bash's own [[ ]]: a grep would carry the secret in its own argv.
  local f args n=0
  for f in /proc/[0-9]*/cmdline; do
    args=$(tr '\0' ' ' 2>/dev/null < "$f") || continue
    n=$((n + 1))
    [[ "$args" == *"$secret"* ]] && fail "the job's secret is on the command line of $f: $args"
  done
  args=$(ps -eo args)
  [[ "$args" == *"$secret"* ]] && fail "the job's secret shows in ps"
  echo "secret checked absent from $n command lines and from ps"
}

case_remotekill() {
  mkdir -p "$NETNS_DIR/pids"
  start_job "${SSH_FLAGS[@]}" --verbose --grace-seconds 5 -np 4 -H "$H1:2,$H2:2" \
    "$WORKER" --hold "$NETNS_DIR/pids" 60
  wait_pid_files "$NETNS_DIR/pids" 4 || { fail "ranks did not start"; show; return; }
  check_secret_not_in_argv "$(cat "$NETNS_DIR/pids/pid.0")"
  local victim
  victim=$(cat "$NETNS_DIR/pids/pid.3")
  ip netns pids "${NETNS_H[2]}" | grep -qx "$victim" || fail "rank 3 is not on host 2"
  kill -KILL "$victim"
  wait_job 60
  [ "$RC" = 137 ] || fail "hvdrun exited $RC, expected 137"
  local first
  first=$(grep -E '^hvdrun: rank [0-9]+ .*(exited with code [1-9]|killed)' "$ERR" | head -1)
  echo "first failure reported: $first"
  [[ "$first" == "hvdrun: rank 3 on host $H2 (ssh pid "*") exited with code 137 (128+9: SIGKILL on that host)" ]] ||
    fail "the first failure named is not rank 3 killed on $H2"
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

case_interrupt() {
  mkdir -p "$NETNS_DIR/pids"
  start_job "${SSH_FLAGS[@]}" -np 4 -H "$H1:2,$H2:2" "$WORKER" --hold "$NETNS_DIR/pids" 60
  wait_pid_files "$NETNS_DIR/pids" 4 || { fail "ranks did not start"; show; return; }
  kill -INT "$JOB"
  wait_job 30
  [ "$RC" = 130 ] || fail "SIGINT: hvdrun exited $RC, expected 130"
  has "$ERR" "received SIGINT, stopping all ranks" || fail "SIGINT not reported"
  [ "$FAILED" = 0 ] || show
  no_leftovers

  # hvdrun SIGKILLed: its ssh clients die with it (PDEATHSIG), the connections close, and the
  # watcher on each host stops its rank.
  rm -f "$NETNS_DIR"/pids/pid.*
  start_job "${SSH_FLAGS[@]}" -np 4 -H "$H1:2,$H2:2" "$WORKER" --hold "$NETNS_DIR/pids" 60
  wait_pid_files "$NETNS_DIR/pids" 4 || { fail "ranks did not start"; show; return; }
  kill -KILL "$JOB"
  wait_job 10
  no_leftovers
}

"case_$CASE"
[ "$FAILED" = 0 ] && echo "PASS: $CASE"
exit "$FAILED"
