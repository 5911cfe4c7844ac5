#!/usr/bin/env bash
# Runs one of Horovod's parallel test files (e.g. its test/parallel/test_torch.py, which this
# repository does not hold) against hvd under hvdrun, with only its import changed:
#
#   scripts/horovod_test.sh FILE NP [--one-device | --mpi]
#
# FILE is copied to a temporary folder with `import horovod.torch as hvd` made `import hvd.torch
# as hvd` (`horovod.tensorflow`'s too, for the files that test what does not depend on the
# framework) and `from horovod.torch.X import ...` made `from hvd.torch.X import ...`, and
# distutils' LooseVersion (gone in Python 3.12) read from `packaging`; its `common` helpers come
# from tests/horovod/common.py. --one-device makes every rank its own host (local
# rank 0), so that on a machine with one GPU all ranks use cuda:0 (hvd then stages their CUDA
# tensors through host memory). --mpi starts the ranks with `hvdrun --mpi` (mpirun), for the
# files that need MPI (mpi4py communicators). Environment: PY (the python with torch; default
# /usr/bin/python3 where it exists), BUILD_DIR (build), LIMIT (seconds, 600), DESELECT (test names to leave out,
# space-separated: a test that fails on some ranks only leaves the others waiting in their next
# collective until HVD_STALL_SHUTDOWN_TIME_SECONDS, set here to 40, shuts hvd down and fails the
# rest of the file).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 FILE NP [--one-device | --mpi]" >&2; exit 2; }
FILE=$1 NP=$2 ONE=${3:-}
[ -f "$FILE" ] || { echo "$0: no file $FILE" >&2; exit 2; }
PY=${PY:-$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)}
B=${BUILD_DIR:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
NAME=$(basename "$FILE")
sed -e 's/^import horovod\.\(torch\|tensorflow\) as hvd/import hvd.torch as hvd/' \
    -e 's/^from horovod\.torch\([a-z_.]*\) import/from hvd.torch\1 import/' \
    -e 's/^from distutils\.version import LooseVersion/from packaging.version import Version as LooseVersion/' \
    "$FILE" > "$T/$NAME"
cp tests/horovod/common.py "$T/"
args=()
CLASS=$(sed -n 's/^class \([A-Za-z0-9_]*\)(.*TestCase.*/\1/p' "$T/$NAME" | head -1)
for t in ${DESELECT:-}; do args+=(--deselect "$NAME::${CLASS:-TorchTests}::$t"); done
export PYTHONPATH="$PWD/$B/python:$T" PYTHONUNBUFFERED=1
export HVD_STALL_CHECK_TIME_SECONDS=${HVD_STALL_CHECK_TIME_SECONDS:-20}
# (At least the check time: a shorter shutdown time is off, as in Horovod.)
CHECK=${HVD_STALL_CHECK_TIME_SECONDS%%.*}
CHECK=${CHECK:-0}
export HVD_STALL_SHUTDOWN_TIME_SECONDS=${HVD_STALL_SHUTDOWN_TIME_SECONDS:-$(( CHECK * 2 > 40 ? CHECK * 2 : 40 ))}
run=("$PY" -m pytest -q -p no:cacheprovider -rfE "$NAME" "${args[@]}")
HVDRUN="$PWD/$B/bin/hvdrun"
cd "$T" || exit 1
if [ "$ONE" = --mpi ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  timeout "${LIMIT:-600}" "$HVDRUN" --mpi -np "$NP" "${run[@]}"
elif [ "$ONE" = --one-device ]; then
  timeout "${LIMIT:-600}" "$HVDRUN" -np "$NP" sh -c \
    "export HVD_LOCAL_RANK=0 HVD_LOCAL_SIZE=1 HVD_CROSS_RANK=\$HVD_RANK HVD_CROSS_SIZE=$NP \
HOROVOD_LOCAL_RANK=0 HOROVOD_LOCAL_SIZE=1 HOROVOD_CROSS_RANK=\$HVD_RANK HOROVOD_CROSS_SIZE=$NP \
&& exec \"\$0\" \"\$@\"" "${run[@]}"
else
  timeout "${LIMIT:-600}" "$HVDRUN" -np "$NP" "${run[@]}"
fi
