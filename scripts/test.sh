#!/usr/bin/env bash
# Installs what is missing, builds everything and runs the whole test suite (CTest).
# Pass CTest arguments to narrow it, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure --timeout 600 "$@"
