#!/usr/bin/env bash
# Builds hvd and its tests with clang and a sanitizer into build-<kind>/, then runs a group of
# tests (CTest labels) under it. Any sanitizer report fails the test it happens in.
#   scripts/sanitize.sh asan          ASan + UBSan; runs the unit and mp labels
#   scripts/sanitize.sh tsan          TSan; runs the engine tests (unit) and the mp label
#   scripts/sanitize.sh asan -L unit  other CTest arguments instead of the default labels
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-asan}
shift || true
case "$kind" in
  asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined" ;;
  tsan) flags="-fsanitize=thread" ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan [ctest arguments]" >&2; exit 2 ;;
esac
# The unit and mp labels, less the resident-set tests (a sanitizer's own memory is not flat),
# the find_package consumer (built by the system compiler, which cannot link a sanitized hvd),
# the long host work of 256 MiB buffers under a short timeout (a sanitizer's shadow of fresh
# pages and its instrumented copies take that long many times over) and the ranks held to 16
# descriptors (the runtime's own checks need descriptors: UBSan's vptr check makes a pipe to
# test that a vtable is readable, and without one reports "invalid vptr" on a sound object).
labels=(-L '^(unit|mp)$'
        -E '^(mp_memory|examples.find_package|mp_long_host_work|mp_descriptor_limit_named)')
[ $# -gt 0 ] && labels=("$@")
scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build-$kind}
# Line tables only: a report's stack names every file and line, and the build takes a third
# less time than with full debug information (-g).
flags="$flags -fno-omit-frame-pointer -gline-tables-only"
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
  -DHVD_BUILD_PYTHON=OFF -DHVD_WITH_CUDA=OFF -DHVD_WITH_NCCL=OFF > /dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
# halt_on_error: the first report ends the process, so the test fails.
# allocator_may_return_null: an impossible allocation returns null, as in production, so the
# out-of-memory paths run instead of ASan's own report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1}
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 "${labels[@]}"
