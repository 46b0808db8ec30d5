#!/usr/bin/env bash
# Join the pieces that prepare_wheels.py split a large file into (FILE.partNN beside
# FILE.sha256), checking every piece and the joined file against the list.
#   bash bench/gpu/join_pieces.sh DIR
set -euo pipefail
cd "$1"
for sums in *.sha256; do
  [ -e "$sums" ] || break
  file=${sums%.sha256}
  sha256sum --quiet -c <(grep '\.part[0-9]*$' "$sums")   # every piece arrived intact
  cat "$file".part* > "$file"
  sha256sum --quiet -c <(grep -v '\.part[0-9]*$' "$sums") # and the joined file
  rm "$file".part* "$sums"
  echo "joined $file"
done
