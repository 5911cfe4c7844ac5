#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan into build-fuzz/, then runs
# each for FUZZ_SECONDS seconds (default 30) starting from its seed corpus. A crash, a leak, a
# sanitizer report or a broken invariant fails the script. Prints, per target, the executions run
# and the coverage reached (libFuzzer's edge and feature counts).
#   scripts/fuzz.sh                 all targets
#   scripts/fuzz.sh control env     some of them
# New interesting inputs go to build-fuzz/corpus/<target>; the repository's seeds are not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-30}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(store handshake control env)
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer -gline-tables-only"
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
  -DHVD_BUILD_TESTS=OFF -DHVD_BUILD_FUZZERS=ON -DHVD_BUILD_PYTHON=OFF \
  -DHVD_WITH_MPI=OFF -DHVD_WITH_CUDA=OFF -DHVD_WITH_NCCL=OFF > /dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"
status=0
printf '%-10s %12s %10s %10s %8s  %s\n' target executions exec/s cov ft result
for t in "${TARGETS[@]}"; do
  corpus="$BUILD_DIR/corpus/$t"
  mkdir -p "$corpus"
  log="$BUILD_DIR/fuzz_$t.log"
  rc=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BUILD_DIR/bin/fuzz_$t" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
    -artifact_prefix="$BUILD_DIR/crash-$t-" -rss_limit_mb=2048 -timeout=10 \
    "$corpus" "tests/fuzz/corpus/$t" > "$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  result=ok
  if [ "$rc" -ne 0 ]; then
    result="FAILED (rc $rc, see $log)"
    status=1
    grep -E 'ERROR|runtime error|==[0-9]+==|Test unit written' "$log" | head -20 || true
  fi
  printf '%-10s %12s %10s %10s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$result"
done
exit $status
