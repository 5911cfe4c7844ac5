#!/usr/bin/env bash
# One data link cut, every rank alive: 3 ranks over TCP in a network namespace of their own,
# allreducing back to back; then the TCP connections between ranks 1 and 2 alone are dropped
# (nftables, inside that namespace). Ranks 1 and 2 still reach rank 0, and rank 0 still hears
# their heartbeats. Expected: every rank fails within HVD_TIMEOUT_SECONDS + 5 s with the same
# cause (no rank called lost, none told it is the one the others gave up on); hvdrun exits
# non-zero with that cause; nothing is left in the namespace. Whether the cause names the cut
# link itself is printed, not asserted (which rank's verdict is first is a race).
#
#   linkcut_test.sh HVDRUN HVD_BENCH
#
# Exit 0: pass; 77: skipped (not root, or no namespaces or nftables here); else: fail.
set -u
HVDRUN=$1 BENCH=$2
NS=hvdlinkcut.$$
DIR=$(mktemp -d)
FAILED=0
fail() { echo "FAIL: $*"; FAILED=1; }

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (network namespaces)"; exit 77; }
for tool in ip nft ss; do
  command -v $tool > /dev/null || { echo "SKIP: no $tool here"; exit 77; }
done
ip netns add "$NS" 2> /dev/null || { echo "SKIP: cannot make a network namespace"; exit 77; }
cleanup() {
  local p
  for p in $(ip netns pids "$NS" 2> /dev/null); do kill -9 "$p" 2> /dev/null; done
  ip netns del "$NS" 2> /dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
ip -n "$NS" link set lo up
IN="ip netns exec $NS"
if ! $IN nft add table inet linkcut 2> /dev/null; then
  echo "SKIP: nftables refuses a table here"
  exit 77
fi

export HVD_TIMEOUT_SECONDS=5
$IN timeout 120 "$HVDRUN" -np 3 --tcp "$BENCH" -b 1M -e 1M -n 1000000 \
  > "$DIR/out" 2> "$DIR/err" &
JOB=$!

# The ranks' pids by HVD_RANK, once the three have formed the job.
declare -A PID=()
for _ in $(seq 1 300); do
  for p in $(ip netns pids "$NS"); do
    [ "$(cat /proc/$p/comm 2> /dev/null)" = "$(basename "$BENCH" | cut -c1-15)" ] || continue
    r=$(tr '\0' '\n' < /proc/$p/environ 2> /dev/null | sed -n 's/^HVD_RANK=//p')
    [ -n "$r" ] && PID[$r]=$p
  done
  [ "${#PID[@]}" = 3 ] && grep -q "float32" "$DIR/out" && break
  sleep 0.1
done
[ "${#PID[@]}" = 3 ] || { fail "the job did not start"; cat "$DIR/err"; exit 1; }
sleep 1
kill -0 $JOB 2> /dev/null || { fail "the job ended before the cut"; cat "$DIR/err"; exit 1; }

# The local ports of rank 1's connections whose other end is rank 2's.
ports_of() { $IN ss -tnpH state established | grep "pid=$1," | awk '{print $3}' | sed 's/.*://'; }
P2=" $(ports_of "${PID[2]}" | tr '\n' ' ')"
PAIR=$($IN ss -tnpH state established | grep "pid=${PID[1]}," | awk '{print $3, $4}' |
  while read -r l p; do [[ "$P2" == *" ${p##*:} "* ]] && echo "${l##*:}"; done | sort -u |
  tr '\n' ',' | sed 's/,$//')
[ -n "$PAIR" ] || { fail "no connection between ranks 1 and 2 found"; exit 1; }
$IN nft add chain inet linkcut out '{ type filter hook output priority 0; policy accept; }' &&
  $IN nft add rule inet linkcut out tcp sport "{ $PAIR }" drop &&
  $IN nft add rule inet linkcut out tcp dport "{ $PAIR }" drop || { fail "cannot cut"; exit 1; }
CUT=$(date +%s%3N)
echo "cut ranks 1 and 2's connections (ports $PAIR)"

wait $JOB
RC=$?
TOOK=$(( $(date +%s%3N) - CUT ))
echo "hvdrun exited $RC after $TOOK ms from the cut"
[ "$RC" != 0 ] || fail "hvdrun exited 0"
[ "$RC" != 124 ] || fail "the job did not end by itself"
[ "$TOOK" -le $(( (HVD_TIMEOUT_SECONDS + 5) * 1000 )) ] || fail "it took $TOOK ms"
grep -v '<stdout>' "$DIR/err"
LINK='link between ranks (1 and 2|2 and 1)'
for r in 0 1 2; do
  line=$(grep "^\[$r\]<stderr>:hvd_bench: rank $r: .* failed: " "$DIR/err" | head -1)
  [ -n "$line" ] || { fail "rank $r reported no failure"; continue; }
  [[ "$line" =~ "rank "[0-9]+" lost:" ]] && fail "rank $r reports a rank lost: $line"
  [[ "$line" =~ "that is this rank" ]] && fail "rank $r takes the blame: $line"
  cause=${line#*failed: }
  [ -z "${first:-}" ] && first=$cause
  [ "$cause" = "$first" ] || fail "rank $r reports another cause than the first rank: $line"
done
summary=$(grep '^hvdrun: ' "$DIR/err")
# (hvdrun shortens a long cause: its first 150 characters.)
[[ "$summary" == *"${first:0:150}"* && -n "${first:-}" ]] || fail "hvdrun's summary is not the ranks' cause: $summary"
# Which rank's verdict comes first is a race: the rank whose sends over the cut link go
# unacknowledged names it; a rank that waited on another in turn names its wait, with what rank
# 0's heartbeats say of the rank it waited on.
if [[ "${first:-}" =~ $LINK ]]; then
  echo "the cause names the link between ranks 1 and 2"
else
  echo "the cause is a waiting rank's verdict"
fi
sleep 0.5
left=$(ip netns pids "$NS")
[ -z "$left" ] || { fail "processes left:"; ps -o pid,args -p "$(echo $left | tr ' ' ',')"; }
[ "$FAILED" = 0 ] && echo "PASS"
exit $FAILED
