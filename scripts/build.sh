#!/usr/bin/env bash
# Configures and builds hvd into build/ (binaries in build/bin, libraries in build/lib).
# Extra arguments go to CMake's configure step, e.g. -DHVD_WITH_MPI=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
