#!/usr/bin/env bash
# Gathers what a bare GPU machine lacks to build hvd (scripts/gpu_check.sh's HVD_DEPS) into one
# folder, from this machine's Debian packages: the asio, cxxopts, GoogleTest and OpenSSL headers,
# GoogleTest's static libraries and libcrypto. Usage: scripts/gpu_deps.sh [DIR] (default
# .gpudeps, which the device tool's `carry` then takes along; keep it out of git, e.g. in
# .git/info/exclude). Then, on the GPU machine: HVD_DEPS=$PWD/.gpudeps scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-.gpudeps}
arch=$(gcc -print-multiarch)
rm -rf "$D"
mkdir -p "$D/include" "$D/lib"
cp -r /usr/include/asio /usr/include/asio.hpp /usr/include/cxxopts.hpp /usr/include/gtest \
      /usr/include/gmock /usr/include/openssl "$D/include/"
cp /usr/include/"$arch"/openssl/*.h "$D/include/openssl/"
cp /usr/lib/"$arch"/libgtest*.a /usr/lib/"$arch"/libgmock*.a "$D/lib/"
cp -L /usr/lib/"$arch"/libcrypto.so.3 "$D/lib/"
cp -L /usr/lib/"$arch"/libcrypto.so.3 "$D/lib/libcrypto.so"
du -sh "$D"
