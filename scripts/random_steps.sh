#!/usr/bin/env bash
# Random steps (docs/RELIABILITY.md): RANDOM_RUNS jobs (default 40) of RANDOM_STEPS steps each
# (default 2,000) of operations of every kind drawn at random (mp_collectives_worker --random,
# tests/multiprocess/mp_random.cc), seeds RANDOM_SEED (default 1000) on. Run k takes one of six
# configurations in turn: 2 ranks with the defaults, 3 over TCP only, 4 with a cache of 5
# entries, 5 with rank 0 answering, 6 with no fusion, and two faked hosts of 3 ranks with
# hierarchical collectives. A run that fails prints its seed and configuration, and the first
# lines of its failure; the same seed and configuration replay it. Exits non-zero if any run
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RANDOM_RUNS:-40}
STEPS=${RANDOM_STEPS:-2000}
FIRST=${RANDOM_SEED:-1000}
HVDRUN="$BUILD_DIR/bin/hvdrun"
WORKER="$PWD/$BUILD_DIR/bin/mp_collectives_worker"
failed=0
for ((k = 0; k < RUNS; k++)); do
  seed=$((FIRST + k))
  np=$((2 + k % 6))
  cmd=("$WORKER" "--random=$STEPS,$seed")
  case $((k % 6)) in
    0) config="" ;;
    1) config="HVD_SHM=off" ;;
    2) config="HVD_CACHE_CAPACITY=5" ;;
    3) config="HVD_SYMMETRIC_NEGOTIATION=off" ;;
    4) config="HVD_FUSION_THRESHOLD=0" ;;
    5) # two faked hosts of 3 ranks (hierarchical needs hosts of equal size)
       np=6
       config="HVD_HIERARCHICAL_ALLREDUCE=1 HVD_HIERARCHICAL_ALLGATHER=1"
       cmd=(sh -c 'export HVD_LOCAL_RANK=$((HVD_RANK % 3)) HVD_LOCAL_SIZE=3 \
                   HVD_CROSS_RANK=$((HVD_RANK / 3)) HVD_CROSS_SIZE=2 && exec "$0" "$1"' \
            "$WORKER" "--random=$STEPS,$seed") ;;
  esac
  start=$SECONDS
  # shellcheck disable=SC2086 # config is a list of assignments
  out=$(env HVD_DYNAMIC_PROCESS_SETS=1 HVD_TIMEOUT_SECONDS=60 $config \
        timeout 900 "$HVDRUN" -np "$np" "${cmd[@]}" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || grep -q "FAIL " <<<"$out"; then
    failed=$((failed + 1))
    echo "FAILED: seed $seed, -np $np, ${config:-defaults} (exit $rc)"
    grep -E "FAIL |rror" <<<"$out" | head -5
  else
    echo "ok: seed $seed, -np $np, ${config:-defaults}, $((SECONDS - start)) s"
  fi
done
echo "random steps: $((RUNS - failed)) of $RUNS runs passed"
[ $failed -eq 0 ]
