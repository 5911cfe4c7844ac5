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
#   loss         the checked job for several rounds over clean links, then with 1% and 5% of
#                the frames between hosts dropped: correct, no peer declared lost; prints the
#                time of a round against the clean run
#   slowlink     the same with both hosts limited to 50 Mbit/s behind a deep queue, then with
#                100 ms netem delay where the kernel has netem (else says it skipped that)
#   partition    host 2 cut off mid-allreduce (HVD_TIMEOUT_SECONDS=5): every rank fails within
#                5 + 5 s naming a rank on the other side, hvdrun exits non-zero
#   halfcut      host 2's frames to host 1 dropped, host 1's to host 2 still delivered (a
#                one-way firewall rule), mid-allreduce: the same as the partition (TCP, with
#                no acknowledgement coming back, stops both ways)
#   launchercut  hvdrun's own host cut off mid-allreduce (HVD_TIMEOUT_SECONDS=5; the hosts
#                still reach each other): hvdrun's ssh sessions give up within about that
#                timeout, at least 10 s (ServerAlive probes), and hvdrun exits non-zero naming a
#                rank whose host it lost, instead of waiting for the link forever; the ranks,
#                without hvdrun's ticks, stop on their hosts within 10 + 2 s, the link still down
#   symmetric    the checked job for 20 rounds with HVD_SYMMETRIC_NEGOTIATION=on: cached
#                tensors agreed in rounds, over TCP links between workers across the hosts
#   symmetric_partition  the partition with HVD_SYMMETRIC_NEGOTIATION=on
#   reboot       host 2 lost at once (port down, its processes killed, namespace deleted)
#                mid-allreduce: the same for the ranks on host 1
#   uneven       hosts of unequal size: HVD_SHM=on with a host of one rank (nothing to set up
#                there: no failure, no warning), then -H a:4,b:2 with a process set of two ranks
#                on each host and hierarchical allreduce forced: the set runs hierarchical
#                (its members' hosts found by the machine they run on), its values checked
#   elastic_kill --min-np 2, 4 ranks over 2 hosts (mp_elastic_worker beside WORKER): a rank on
#                host 2 is killed; host 2 is blacklisted and the job ends on host 1's 2 ranks
#   elastic_add  a discovery script that lists host 1, then host 2 as well: the job grows from
#                2 to 4 ranks over ssh
#   elastic_unreachable  -np 4 --min-np 2 with 2 slots on a host nobody answers on: that host
#                is blacklisted when its ssh check fails and the job ends on host 1's 2 ranks
#   elastic_partition  host 2 cut off mid-job (HVD_TIMEOUT_SECONDS=3): host 1's ranks give up on
#                it; hvdrun finds host 2's ranks gone once their ssh sessions give up (about 3 s)
#                or kills them once they have not left their world 3 + 5 s later, blacklists
#                host 2, and the job ends on host 1's 2 ranks (the cut comes once world 1
#                has formed)
# After every job no process but sshd's listener is left in the host namespaces (after a
# partition: no process of hvd's; sshd's own sessions wait for the link to come back).
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
  # Up to 30 s: after a heal, a cut-off worker still connecting to the store gets through only
  # at its next SYN (the kernel's backoff), learns it has no place in the new world, and exits.
  for i in $(seq 1 300); do
    left="$(netns_leftovers 1) $(netns_leftovers 2)"
    [ -z "${left// /}" ] && return 0
    sleep 0.1
  done
  left=$(echo $left | tr ' ' ',')
  fail "processes left on the hosts:"; ps -o pid,ppid,pgid,args -p "$left"
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

# rounds_job LABEL N: the checked job, N rounds, 4 ranks on 2 hosts; ROUND_MS is the time of
# one round.
rounds_job() {
  start_job "${SSH_FLAGS[@]}" -np 4 -H "$H1:2,$H2:2" "$WORKER" --rounds "$2"
  wait_job 120
  ROUND_MS=$(sed -n "s/.*ROUNDS-MS $2 \([0-9]*\).*/\1/p" "$OUT")
  [ "$RC" = 0 ] || fail "$1: hvdrun exited $RC"
  [ "$(grep -c 'CHECKS-OK rank' "$OUT")" = 4 ] || fail "$1: not every rank checked OK"
  cat "$OUT" "$ERR" | grep -qE "FAIL|Timeout|PeerLost|nothing heard" &&
    fail "$1: a peer was declared lost"
  ROUND_MS=$(( ${ROUND_MS:-0} / $2 ))
  [ "$FAILED" = 0 ] || show
}

# The loss and slow-link jobs run with the default HVD_TIMEOUT_SECONDS (30 s): TCP's own
# retransmission backoff can leave a lossy link silent for several seconds.
case_loss() {
  rounds_job "clean links" 10
  local base=$ROUND_MS pct rounds
  echo "MEASURE clean links: $base ms per round"
  for pct in 1 5; do
    rounds=$([ "$pct" = 1 ] && echo 10 || echo 4)
    netns_loss "$pct" || { fail "cannot add the nftables rule"; return; }
    rounds_job "$pct% loss" "$rounds"
    echo "MEASURE $pct% loss: $ROUND_MS ms per round ($(awk -v a="$ROUND_MS" -v b="$base" \
      'BEGIN {printf "%.1f", a / (b > 0 ? b : 1)}')x the clean run), $rounds rounds," \
      "frames dropped: $(netns_loss_count)"
    netns_loss 0
  done
  no_leftovers
}

case_slowlink() {
  rounds_job "clean links" 10
  local base=$ROUND_MS
  netns_rate 1 50mbit && netns_rate 2 50mbit || { fail "cannot add the tbf qdisc"; return; }
  rounds_job "50 Mbit/s" 5
  # Each round's 4 MiB ring allreduce sends 2 * 3/4 * 4 MiB over each of the two host-crossing
  # hops, one per direction of the link.
  echo "MEASURE 50 Mbit/s links: $ROUND_MS ms per round (clean: $base ms); the 4 MiB" \
    "allreduce alone needs >= $(( 6 * 8 * 1024 * 1024 / 50000 )) ms at that rate"
  netns_rate 1 ""; netns_rate 2 ""
  if netns_netem_delay 1 50 && netns_netem_delay 2 50; then
    rounds_job "netem delay" 5
    echo "MEASURE 100 ms round trip (netem): $ROUND_MS ms per round"
  else
    echo "SKIPPED netem delay: this kernel has no netem (sch_netem)"
  fi
  no_leftovers
}

# hvd_leftovers I: processes in host I other than sshd's (listener or sessions).
hvd_leftovers() {
  local pid
  for pid in $(ip netns pids "${NETNS_H[$1]}" 2>/dev/null); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sshd ] || echo "$pid"
  done
}

# check_fail_file R CUT_MS LIMIT_MS PATTERN: rank R wrote its failure within LIMIT_MS of the cut
# and its message matches PATTERN (names a rank across the cut).
check_fail_file() {
  local f=$NETNS_DIR/pids/fail.$1 i at msg
  for i in $(seq 1 $(( ($3 + 5000) / 100 ))); do [ -s "$f" ] && break; sleep 0.1; done
  [ -s "$f" ] || { fail "rank $1 did not fail within $(( $3 / 1000 + 5 )) s of the cut"; return; }
  read -r at msg < "$f"
  echo "rank $1 failed $(( at - $2 )) ms after the cut: $msg"
  [ $(( at - $2 )) -le "$3" ] || fail "rank $1 failed $(( at - $2 )) ms after the cut (limit $3)"
  [[ "$msg" =~ $4 ]] || fail "rank $1 does not name a rank across the cut: $msg"
}

# Ranks 0, 1 on host 1 and 2, 3 on host 2 allreduce 1 MiB back to back; host 2 then goes.
fault_job() {
  mkdir -p "$NETNS_DIR/pids"
  export HVD_TIMEOUT_SECONDS=5
  start_job "${SSH_FLAGS[@]}" --grace-seconds 3 -np 4 -H "$H1:2,$H2:2" \
    "$WORKER" --hold "$NETNS_DIR/pids" 120 262144
  wait_pid_files "$NETNS_DIR/pids" 4 || { fail "ranks did not start"; show; return 1; }
  sleep 1
  [ -e "$NETNS_DIR/pids/fail.0" ] && { fail "the job failed before the fault"; show; return 1; }
  CUT_MS=$(date +%s%3N)
}

# check_cut_failures: after a cut between the hosts (fault_job's), every rank failed within
# HVD_TIMEOUT_SECONDS + 5 s naming a rank across it, and hvdrun exited non-zero.
check_cut_failures() {
  local limit=$(( (HVD_TIMEOUT_SECONDS + 5) * 1000 )) r
  for r in 0 1; do check_fail_file "$r" "$CUT_MS" "$limit" "rank [23]([^0-9]|$)"; done
  for r in 2 3; do check_fail_file "$r" "$CUT_MS" "$limit" "rank [01]([^0-9]|$)"; done
  wait_job 30
  [ "$RC" != 0 ] && [ "$RC" != -1 ] || fail "hvdrun exited $RC"
  echo "hvdrun exited $RC after $(( $(date +%s%3N) - CUT_MS )) ms from the cut"
  grep '^hvdrun:' "$ERR"
}

case_partition() {
  fault_job || return
  netns_cut 2
  check_cut_failures
  # hvdrun cannot reach host 2 either: it names the ranks there as lost to it (their ssh gave up)
  # or as not stopped when asked, without --verbose.
  local r
  for r in 2 3; do
    has "$ERR" "^hvdrun: rank $r on host $H2 .*(ssh failed or lost the connection|did not stop within)" ||
      fail "hvdrun does not name rank $r on the host cut off"
  done
  local left="$(hvd_leftovers 1) $(hvd_leftovers 2) $(ip netns pids "$NETNS_L")"
  [ -z "${left// /}" ] || { fail "processes left:"; ps -o pid,args -p "$(echo $left | tr " " ",")"; }
  [ "$FAILED" = 0 ] || show
  # sshd's sessions on host 2 still wait for hvdrun's side of the link: they go once it is back.
  netns_heal 2
  local i
  for i in $(seq 1 300); do
    left=$(echo $(netns_leftovers 1) $(netns_leftovers 2))
    [ -z "$left" ] && break
    sleep 0.1
  done
  echo "30 s after the link came back, sshd sessions left: ${left:-none}"
}

# Host 2's frames to host 1 dropped, host 1's to host 2 still delivered (a firewall rule or a
# broken transmit path on one side), mid-allreduce.
case_halfcut() {
  fault_job || return
  local nft="ip netns exec ${NETNS_H[2]} nft"
  $nft add table ip hvdhalfcut &&
    $nft add chain ip hvdhalfcut out '{ type filter hook output priority 0; policy accept; }' &&
    $nft add rule ip hvdhalfcut out ip daddr "$H1" drop || { fail "cannot cut one way"; return; }
  check_cut_failures
  $nft delete table ip hvdhalfcut
  no_leftovers  # (hvdrun's own link was never cut: its sshd sessions go with the job)
  local left=$(echo $(ip netns pids "$NETNS_L"))
  [ -z "$left" ] || { fail "processes left on the launcher's host:"; ps -o pid,args -p "$(echo $left | tr " " ",")"; }
  [ "$FAILED" = 0 ] || show
  export -n HVD_TIMEOUT_SECONDS
}

case_launchercut() {
  fault_job || return
  ip -n "$NETNS_SW" link set p1 down  # the launcher's port (10.233.0.1)
  # ssh gives up about max(HVD_TIMEOUT_SECONDS, 10) s into the silence; then the grace.
  wait_job 60
  [ "$RC" != 0 ] && [ "$RC" != -1 ] || fail "hvdrun exited $RC"
  local took=$(( $(date +%s%3N) - CUT_MS ))
  echo "hvdrun exited $RC after $took ms from the cut"
  [ "$took" -le 30000 ] ||
    fail "hvdrun took $took ms after the cut (timeout $HVD_TIMEOUT_SECONDS s)"
  has "$ERR" "^hvdrun: rank [0-3] " || fail "hvdrun names no rank"
  has "$ERR" "^hvdrun: the ssh connections to every remote host were lost \\($H1, $H2\\)" ||
    fail "hvdrun does not say that it lost every host at once"
  grep '^hvdrun:' "$ERR" | head -8
  local left i
  left=$(echo $(ip netns pids "$NETNS_L"))
  [ -z "$left" ] || { fail "processes left on the launcher's host:"; ps -o pid,args -p "$(echo $left | tr " " ",")"; }
  # The ranks never lost each other, but hvdrun's ticks stopped: each host's watcher stops its
  # ranks about when hvdrun's ssh gave up (10 s) plus two ticks, with the link still down.
  for i in $(seq 1 300); do
    left=$(echo $(hvd_leftovers 1) $(hvd_leftovers 2))
    [ -z "$left" ] && break
    sleep 0.1
  done
  took=$(( $(date +%s%3N) - CUT_MS ))
  if [ -n "$left" ]; then
    fail "the ranks still run $took ms after the cut of hvdrun's link:"
    ps -o pid,args -p "$(echo $left | tr " " ",")"
  else
    echo "the hosts' ranks stopped $took ms after the cut, the link still down"
    # 10 + 2 s of silence, then SIGTERM (the worker leaves at once); the rest is slack for a
    # loaded machine.
    [ "$took" -le 25000 ] || fail "the ranks stopped $took ms after the cut (expected about 12 s)"
  fi
  [ "$FAILED" = 0 ] || show
  ip -n "$NETNS_SW" link set p1 up
  export -n HVD_TIMEOUT_SECONDS
}

# Symmetric negotiation across hosts (HVD_SYMMETRIC_NEGOTIATION=on): the ranks agree on cached
# tensors in rounds, over shared memory within a host and TCP links between workers across.
case_symmetric() {
  export HVD_SYMMETRIC_NEGOTIATION=on HVD_LOG_LEVEL=info
  rounds_job "symmetric negotiation" 20
  cat "$OUT" "$ERR" | grep -q "rounds between every pair of ranks, over TCP" ||
    fail "rank 0 does not say it negotiates in rounds over TCP"
  echo "MEASURE symmetric negotiation across hosts: $ROUND_MS ms per round"
  no_leftovers
}

# The partition with the survivors waiting in rounds across the cut.
case_symmetric_partition() {
  export HVD_SYMMETRIC_NEGOTIATION=on
  case_partition
}

case_reboot() {
  fault_job || return
  netns_reboot 2
  local limit=$(( (HVD_TIMEOUT_SECONDS + 5) * 1000 )) r
  for r in 0 1; do check_fail_file "$r" "$CUT_MS" "$limit" "rank [23]([^0-9]|$)"; done
  wait_job 30
  [ "$RC" != 0 ] && [ "$RC" != -1 ] || fail "hvdrun exited $RC"
  echo "hvdrun exited $RC after $(( $(date +%s%3N) - CUT_MS )) ms from the loss of host 2"
  grep '^hvdrun:' "$ERR" | head -5
  local left="$(netns_leftovers 1) $(ip netns pids "$NETNS_L")"
  [ -z "${left// /}" ] || { fail "processes left:"; ps -o pid,args -p "$(echo $left | tr " " ",")"; }
  [ "$FAILED" = 0 ] || show
}

case_elastic_kill() {
  start_job "${SSH_FLAGS[@]}" --network-interface eth0 -np 4 --min-np 2 -H "$H1:2,$H2:2" \
    "$(dirname "$WORKER")/mp_elastic_worker" --steps 40 --die-worker 3 --die-at-step 7
  wait_job 90
  [ "$RC" = 0 ] || fail "hvdrun exited $RC"
  has "$ERR" "host $H2 is blacklisted" || fail "host 2 was not blacklisted"
  has "$OUT" "ELASTIC-NATIVE-OK size 2 generation 2 resets 1" || fail "no world of 2 finished"
  ! has "$OUT" "FAIL " || fail "a worker failed its checks"
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

# wait_world G: until rank 0 of mp_elastic_worker says world G formed (at most 60 s).
wait_world() {
  local i
  for i in $(seq 1 600); do
    has "$OUT" "ELASTIC-NATIVE-WORLD generation $1 " && return 0
    kill -0 "$JOB" 2>/dev/null || break
    sleep 0.1
  done
  has "$OUT" "ELASTIC-NATIVE-WORLD generation $1 " || fail "world $1 did not form within 60 s"
}

case_elastic_add() {
  echo "$H1:2" > "$NETNS_DIR/hosts"
  printf '#!/bin/sh\ncat "%s"\n' "$NETNS_DIR/hosts" > "$NETNS_DIR/discover.sh"
  chmod +x "$NETNS_DIR/discover.sh"
  start_job "${SSH_FLAGS[@]}" --network-interface eth0 -np 2 \
    --host-discovery-script "$NETNS_DIR/discover.sh" \
    "$(dirname "$WORKER")/mp_elastic_worker" --steps 400 --step-ms 20
  # Host 2 comes once world 1 runs (before that, a loaded machine would start the first
  # workers in world 2 directly, with no reset to test).
  wait_world 1
  echo "$H2:2" >> "$NETNS_DIR/hosts"
  wait_job 90
  [ "$RC" = 0 ] || fail "hvdrun exited $RC"
  has "$ERR" "world 2: 4 rank\(s\) \(hosts changed\), 2 new worker\(s\)" || fail "host 2 did not join"
  has "$OUT" "ELASTIC-NATIVE-OK size 4 generation 2 resets 1" || fail "no world of 4 finished"
  ! has "$OUT" "FAIL " || fail "a worker failed its checks"
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

case_elastic_partition() {
  start_job "${SSH_FLAGS[@]}" --network-interface eth0 --timeout 3 -np 4 --min-np 2 \
    -H "$H1:2,$H2:2" "$(dirname "$WORKER")/mp_elastic_worker" --steps 800 --step-ms 20
  wait_world 1
  sleep 1
  netns_cut 2
  wait_job 120
  [ "$RC" = 0 ] || fail "hvdrun exited $RC"
  # Found either way: their ssh sessions give up on the host (ServerAlive probes, about
  # --timeout), or they have not left world 1 3 + 5 s after the others did.
  has "$ERR" "has not left world 1 8 s after|host $H2 .*ssh failed or lost the connection" ||
    fail "hvdrun did not find the cut-off ranks"
  has "$ERR" "host $H2 is blacklisted" || fail "host 2 was not blacklisted"
  has "$OUT" "ELASTIC-NATIVE-OK size 2 generation 2 resets 1" || fail "no world of 2 finished"
  [ "$FAILED" = 0 ] || show
  netns_heal 2
  no_leftovers
}

case_elastic_unreachable() {
  # Slots on a host nobody answers on: its ssh check fails as the first world starts; the host
  # is blacklisted and the job runs on host 1's 2 ranks (--min-np 2) instead of stopping.
  start_job "${SSH_FLAGS[@]}" --network-interface eth0 --start-timeout 3 -np 4 --min-np 2 \
    -H "$H1:2,10.233.0.99:2" "$(dirname "$WORKER")/mp_elastic_worker" --steps 40
  wait_job 90
  [ "$RC" = 0 ] || fail "hvdrun exited $RC"
  has "$ERR" "cannot start worker 10.233.0.99:0#2: host 10.233.0.99 failed the ssh check" ||
    fail "the unreachable host was not named"
  has "$ERR" "host 10.233.0.99 is blacklisted" || fail "the unreachable host was not blacklisted"
  ! has "$ERR" "10.233.0.99:1#3" || fail "a second worker was tried on the blacklisted host"
  has "$OUT" "ELASTIC-NATIVE-OK size 2 generation 2 resets 0" || fail "no world of 2 finished"
  ! has "$OUT" "FAIL " || fail "a worker failed its checks"
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

case_uneven() {
  HVD_SHM=on start_job "${SSH_FLAGS[@]}" -np 3 -H "$H1:2,$H2:1" "$WORKER"
  wait_job 90
  [ "$RC" = 0 ] || fail "HVD_SHM=on with a host of one rank: hvdrun exited $RC"
  [ "$(grep -c '^\[[0-2]\]<stdout>:CHECKS-OK rank' "$OUT")" = 3 ] || fail "not every rank checked OK"
  ! grep -q "could not set up shared memory" "$OUT" "$ERR" || fail "a lone rank's host warned"
  [ "$FAILED" = 0 ] || show
  no_leftovers

  HVD_DYNAMIC_PROCESS_SETS=1 HOROVOD_HIERARCHICAL_ALLREDUCE=1 HVD_LOG_LEVEL=info \
    start_job "${SSH_FLAGS[@]}" -np 6 -H "$H1:4,$H2:2" "$WORKER" --set 0,1,4,5
  wait_job 120
  [ "$RC" = 0 ] || fail "a set on hosts of unequal size: hvdrun exited $RC"
  [ "$(grep -c '<stdout>:SET-OK rank' "$OUT")" = 4 ] || fail "not every member checked its set"
  has "$ERR" "process set: hierarchical collectives ready: this host's ranks \[0, 1\], across hosts \[0, 4\]" ||
    fail "the set did not run hierarchical"
  [ "$FAILED" = 0 ] || show
  no_leftovers
}

"case_$CASE"
[ "$FAILED" = 0 ] && echo "PASS: $CASE"
exit "$FAILED"
