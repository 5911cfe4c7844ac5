#!/usr/bin/env bash
# The GPU checks of docs/GPU.md on a machine with a CUDA device: builds hvd (CUDA, NCCL and the
# Python extension for the python3 that has PyTorch), runs the tests labelled gpu, the CUDA
# pytest module at one and two ranks, and the GPU benchmarks. Logs go to $OUT (default
# /tmp/hvd-gpu); the last lines printed are the benchmark tables (SKIP_BENCH=1: none).
#
# Dependencies the machine lacks may come from a folder laid out like /usr (include/, lib/):
# HVD_DEPS=/path (asio, cxxopts, openssl, gtest headers; libcrypto and libgtest). NCCL is taken
# from the CUDA toolkit, else from the nvidia-nccl wheel beside PyTorch.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hvd-gpu}
BUILD=${BUILD_DIR:-build-gpu}
PY=${PYTHON:-$(command -v python3)}
mkdir -p "$OUT"
# The system compiler, whose libstdc++ the Python process (and torch) already loaded: a private
# toolchain (CXX=/opt/...) may link its own libstdc++ statically into libhvd, and two C++
# runtimes in one process crash at the first stream they share.
export CC=${HVD_CC:-/usr/bin/gcc} CXX=${HVD_CXX:-/usr/bin/g++} CUDAHOSTCXX=${HVD_CXX:-/usr/bin/g++}
args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DHVD_WITH_CUDA=ON -DHVD_WITH_MPI=OFF
      -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_CUDA_HOST_COMPILER="$CXX"
      -DPython3_EXECUTABLE="$PY" -DHVD_BUILD_PYTHON=ON)
[ -n "${CUDA_ARCHS:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
if [ -n "${HVD_DEPS:-}" ]; then
  args+=(-DCMAKE_CXX_FLAGS="-isystem $HVD_DEPS/include" -DASIO_INCLUDE_DIR="$HVD_DEPS/include"
         -DGTEST_ROOT="$HVD_DEPS")
  # The machine's own libcrypto where it has one: a second copy in the same process as
  # Python's ssl module corrupts the heap.
  crypto=$(ldconfig -p | awk '/libcrypto\.so\.3 .*x86-64/ {print $NF; exit}')
  if [ -n "$crypto" ]; then
    args+=(-DOPENSSL_INCLUDE_DIR="$HVD_DEPS/include" -DOPENSSL_CRYPTO_LIBRARY="$crypto")
  else
    args+=(-DOPENSSL_ROOT_DIR="$HVD_DEPS")
    export LD_LIBRARY_PATH="$HVD_DEPS/lib:${LD_LIBRARY_PATH:-}"
  fi
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/nccl.h" ]; then
  nccl=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ]; then
    lib=$(ls "$nccl"/lib/libnccl.so* | head -1)
    args+=(-DHVD_WITH_NCCL=ON -DNCCL_INCLUDE_DIR="$nccl/include" -DNCCL_LIBRARY="$lib")
    export LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}"
  fi
fi
echo "== configure" && cmake -S . -B "$BUILD" "${args[@]}" > "$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; exit 1; }
grep -E "CUDA|NCCL|python" "$OUT/configure.log" | tail -5
echo "== build" && cmake --build "$BUILD" -j "$(nproc)" > "$OUT/build.log" 2>&1 \
  || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
B=$BUILD/bin
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
echo "== ctest -L gpu and the fake-device tests"
ctest --test-dir "$BUILD" -L gpu --output-on-failure > "$OUT/ctest.log" 2>&1 || status=1
ctest --test-dir "$BUILD" -R "mp_device" --output-on-failure >> "$OUT/ctest.log" 2>&1 || status=1
# The staged allreduce in many pieces (the default keeps these tests' tensors in one).
HVD_STAGING_PIECE_BYTES=4096 ctest --test-dir "$BUILD" -R "gpu_device_np2" --output-on-failure \
  >> "$OUT/ctest.log" 2>&1 || status=1
grep -E "tests passed|Passed|Failed|Skipped|\[mp\]|FAIL" "$OUT/ctest.log" | head -40
export PYTHONPATH="$BUILD/python:tests/python" PYTHONUNBUFFERED=1 HVD_STALL_CHECK_TIME_SECONDS=20
for run in "1 0 4194304" "2 0 4194304" "1 1 4194304" "2 0 4096"; do
  set -- $run
  echo "== pytest test_torch_cuda.py, $1 rank(s), HVD_ENABLE_ASYNC_COMPLETION=$2," \
       "HVD_STAGING_PIECE_BYTES=$3"
  log="$OUT/pytest_np$1_async$2_piece$3.log"
  HVD_ENABLE_ASYNC_COMPLETION=$2 HVD_STAGING_PIECE_BYTES=$3 timeout 600 "$B/hvdrun" -np $1 \
    "$PY" -m pytest -x -q -p no:cacheprovider tests/python/test_torch_cuda.py > "$log" 2>&1 \
    || status=1
  tail -4 "$log"
done
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit $status  # SKIP_BENCH=1: the checks alone
echo "== benchmarks"
{
  "$B/hvd_gpu_bench" --copy --tensors=1000
  "$B/hvd_gpu_bench" --nccl --iters=200 --max-bytes=$((1 << 30))
  HVD_ENABLE_ASYNC_COMPLETION=1 "$B/hvd_gpu_bench" --nccl --iters=200 --max-bytes=$((1 << 30))
  for piece in 0 4194304; do
    HVD_STAGING_PIECE_BYTES=$piece "$B/hvdrun" --no-prefix -np 2 "$B/hvd_gpu_bench" --staging \
      --max-bytes=$((256 << 20))
  done
} 2>&1 | tee "$OUT/bench.log"
exit $status
