#!/usr/bin/env bash
# On the GPU machine: join the wheel pieces gathered in WHEELS (default /root/wheels), check
# them against their .sha256 lists, and install every wheel into SITE (default /root/site)
# without touching the image's packages. Then: export PYTHONPATH=$SITE:$PYTHONPATH.
#   bash bench/gpu/install.sh [WHEELS] [SITE]
set -euo pipefail
WHEELS=${1:-/root/wheels}
SITE=${2:-/root/site}
cd "$WHEELS"
for sums in *.whl.sha256; do
  wheel=${sums%.sha256}
  sha256sum --quiet -c <(grep '\.part[0-9]*$' "$sums")   # every piece arrived intact
  cat "$wheel".part* > "$wheel"
  sha256sum --quiet -c <(grep -v '\.part[0-9]*$' "$sums") # and the joined wheel
  rm "$wheel".part*
  echo "joined $wheel"
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl
echo "installed $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE"
