#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the example MLP on 4 ranks of this
# machine over hvd's TCP transport, averaging gradients with allreduce.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
NP=${NP:-4}
exec build/bin/hvdrun -np "$NP" build/bin/mlp_trainer "$@"
