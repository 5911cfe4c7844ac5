#!/usr/bin/env bash
# Installs the Debian 12 packages hvd needs to build, test and run (idempotent; needs root or
# sudo). Only Debian's own packages are used.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libasio-dev libcxxopts-dev libgtest-dev libgmock-dev libssl-dev
  pybind11-dev python3-pybind11 python3-dev python3-pip python3-setuptools python3-wheel
  python3-numpy python3-torch python3-pytest python3-sklearn python3-cloudpickle
  openmpi-bin libopenmpi-dev python3-mpi4py
  openssh-server openssh-client iproute2 procps psmisc
  clang libclang-rt-14-dev stress-ng nftables python3-matplotlib
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
