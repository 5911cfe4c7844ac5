#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the example MLP on 4 ranks of this
# machine, averaging gradients with allreduce (over shared memory: the ranks share this host).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
NP=${NP:-4}
exec build/bin/hvdrun -np "$NP" build/bin/mlp_trainer "$@"
