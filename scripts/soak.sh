#!/usr/bin/env bash
# The soak (docs/RELIABILITY.md): SOAK_COUNT allreduces (default 1,000,000) over 3,000 names in
# turn, more than the response cache holds, at each world size in SOAK_NP (default "2 4"). Each
# rank samples its resident set and open descriptors ten times; after allreduce 10,000 the
# resident set may grow by at most 1 MiB and the descriptors not at all.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
COUNT=${SOAK_COUNT:-1000000}
for np in ${SOAK_NP:-2 4}; do
  echo "== soak: $COUNT allreduces at -np $np"
  "$BUILD_DIR/bin/hvdrun" -np "$np" --timeout 60 "$BUILD_DIR/bin/mp_collectives_worker" \
    --soak="$COUNT"
done
