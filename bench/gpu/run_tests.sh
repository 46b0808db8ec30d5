#!/usr/bin/env bash
# On the GPU machine, from the repository root, after install.sh: the engine's integration
# tests on CUDA, with the real default model that install.sh built in the data folder.
#   bash bench/gpu/run_tests.sh [pytest args...]
set -uo pipefail
source bench/gpu/env.sh
python3 -m pytest -p no:cacheprovider -rA --durations=15 \
  tests/integration/test_vllm_engine.py tests/integration/test_training.py \
  tests/integration/test_lora.py tests/integration/test_member_noise.py \
  tests/unit/test_cuda_weights.py tests/unit/test_member_noise.py "$@"
