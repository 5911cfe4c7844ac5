#!/usr/bin/env bash
# Cross-"host" allreduce bandwidth over veth: hvd (hvdrun + hvd_bench) against Open MPI's tcp
# btl (mpirun over ssh) between the same two network namespaces. A measuring helper, not a
# CTest; needs root. Prints both tables.
#
#   tests/netns/bench_veth.sh HVDRUN HVD_BENCH [MAX_BYTES]      e.g. build/bin/hvdrun build/bin/hvd_bench 64M
#
# With HIERARCHICAL=1 it instead runs hvd on 2 hosts x 2 ranks three times (flat ring,
# hierarchical, the automatic choice: HVD_HIERARCHICAL_ALLREDUCE=0, 1, auto), each host's link
# limited to RATE (default 2gbit, a NIC-like rate; tc tbf), and prints the three tables.
# COLL=allgather does the same for allgather (HVD_HIERARCHICAL_ALLGATHER).
# With AUTOTUNE=1 it runs a step of TENSORS allreduces of SIZE (default 32 x 64K) on the same
# hosts and links: flat, hierarchical, the automatic choice, then autotune, and prints the
# autotuned choice.
# With SYMMETRIC=1 it runs hvd on 3 hosts x 1 rank and 2 hosts x 2 ranks with
# HVD_SYMMETRIC_NEGOTIATION=off (rank 0 answers) and on (rounds between every pair of ranks,
# over TCP across hosts), alternating REPEATS (default 3) times: a 4-byte allreduce and a step
# of TENSORS (default 100) allreduces of 4 KiB; the table rows and the negotiation lines.
set -u
HVDRUN=$1 BENCH=$2 MAX=${3:-64M}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/netns_hosts.sh"
netns_hosts_up "$([ "${SYMMETRIC:-0}" = 1 ] && echo 3 || echo 2)" ||
  { echo "cannot set up the fake hosts"; exit 1; }
H1=${NETNS_ADDR[1]} H2=${NETNS_ADDR[2]}
SSH_FLAGS=(--ssh-config "$NETNS_SSH_CONFIG" -i "$NETNS_SSH_KEY" -p "$NETNS_SSH_PORT")
cd "$NETNS_DIR" || exit 1

if [ "${AUTOTUNE:-0}" = 1 ]; then
  # A training step of TENSORS allreduces of SIZE on 2 hosts x 2 ranks, links at RATE: flat,
  # hierarchical and the planner's rule by hand, then autotune from the planner's rule (the
  # median step counts its tuning; its choice is in the log it prints).
  netns_rate 1 "${RATE:-2gbit}" && netns_rate 2 "${RATE:-2gbit}" || { echo "tc tbf failed"; exit 1; }
  log="$NETNS_DIR/autotune.csv"
  for mode in 0 1 auto tune; do
    knobs=(HVD_HIERARCHICAL_ALLREDUCE="$mode")
    if [ "$mode" = tune ]; then
      knobs=(HVD_HIERARCHICAL_ALLREDUCE=auto HVD_AUTOTUNE=1 HVD_AUTOTUNE_LOG="$log"
             HVD_AUTOTUNE_STEPS_PER_SAMPLE="${STEPS_PER_SAMPLE:-3}")
    fi
    echo "=== hvd ${TENSORS:-32} x ${SIZE:-64K} per step: ${knobs[*]}, 2 hosts x 2 ranks, links at ${RATE:-2gbit}"
    env "${knobs[@]}" timeout 600 ip netns exec "$NETNS_L" "$HVDRUN" \
      "${SSH_FLAGS[@]}" --no-prefix -H "$H1:2,$H2:2" "$BENCH" --tensors "${TENSORS:-32}" \
      -b "${SIZE:-64K}" -e "${SIZE:-64K}" -n "${STEPS:-300}" --no-check
  done
  echo "=== autotune's choice (last line of its log)"
  tail -1 "$log"
  exit 0
fi

if [ "${SYMMETRIC:-0}" = 1 ]; then
  H3=${NETNS_ADDR[3]}
  for spec in "$H1:1,$H2:1,$H3:1" "$H1:2,$H2:2"; do
    for rep in $(seq "${REPEATS:-3}"); do
      for mode in off on; do
        echo "=== hvd -H $spec, HVD_SYMMETRIC_NEGOTIATION=$mode (run $rep)"
        for what in "-b 4 -e 4 -n 2000" "--tensors ${TENSORS:-100} -b 4K -e 4K -n 300"; do
          # shellcheck disable=SC2086
          env HVD_SYMMETRIC_NEGOTIATION="$mode" HVD_CACHE_CAPACITY=16384 timeout 300 \
            ip netns exec "$NETNS_L" "$HVDRUN" "${SSH_FLAGS[@]}" --no-prefix -H "$spec" \
            "$BENCH" $what | grep -E '^ +[0-9]|^# negotiation|^#   of it'
        done
      done
    done
  done
  exit 0
fi

if [ "${HIERARCHICAL:-0}" = 1 ]; then
  netns_rate 1 "${RATE:-2gbit}" && netns_rate 2 "${RATE:-2gbit}" || { echo "tc tbf failed"; exit 1; }
  COLL=${COLL:-allreduce}
  case "$COLL" in allreduce|allgather) ;; *) echo "COLL must be allreduce or allgather"; exit 2 ;; esac
  KNOB=HVD_HIERARCHICAL_${COLL^^}
  for mode in 0 1 auto; do
    echo "=== hvd $COLL: $KNOB=$mode, 2 hosts x 2 ranks, links at ${RATE:-2gbit}"
    env "$KNOB=$mode" timeout 600 ip netns exec "$NETNS_L" "$HVDRUN" \
      "${SSH_FLAGS[@]}" --no-prefix -H "$H1:2,$H2:2" "$BENCH" --coll "$COLL" -b 4K -e "$MAX" \
      -B 256 ${CSV:+--csv}
  done
  exit 0
fi

for spec in "$H1:1,$H2:1" "$H1:2,$H2:2"; do
  echo "=== hvd: hvdrun -H $spec hvd_bench (tcp over veth)"
  timeout 300 ip netns exec "$NETNS_L" "$HVDRUN" "${SSH_FLAGS[@]}" -H "$spec" \
    "$BENCH" -b 1K -e "$MAX" -B 512
done

if command -v mpicc > /dev/null && command -v mpirun > /dev/null; then
  mpicc -O3 -march=native -o "$NETNS_DIR/mpi_allreduce_bench" \
    "${PEERS_DIR:-$HERE/../../../shared/peers}/mpi_allreduce_bench.c" 2> /dev/null || { echo "mpicc failed"; exit 0; }
  for spec in "$H1:1,$H2:1" "$H1:2,$H2:2"; do
    np=$(( ${spec##*:} * 2 ))
    echo "=== Open MPI: mpirun -np $np --host $spec --mca btl tcp,self"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 \
      ip netns exec "$NETNS_L" mpirun -np "$np" --host "$spec" --oversubscribe \
      --mca plm_rsh_agent "ssh -F $NETNS_SSH_CONFIG -i $NETNS_SSH_KEY -p $NETNS_SSH_PORT" \
      --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include eth0 \
      --mca oob_tcp_if_include eth0 \
      "$NETNS_DIR/mpi_allreduce_bench" -b 1K -e "$MAX" -B 512
  done
fi
