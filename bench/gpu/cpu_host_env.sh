# Source on the GPU machine before a command of ES Lab's CPU build there (after
# install_cpu_host.sh): its Python 3.11 first on PATH, this checkout importable, and no GPU in
# sight, so that the engine takes vLLM's CPU backend on the host's cores exactly as on a
# machine without a GPU. pip looks only in the kit (the models' wheels that tests download).
CPU_HOST_KIT=${CPU_HOST_KIT:-/root/cpu-host}
export PATH=$(dirname "$(readlink -f "$CPU_HOST_KIT/python")"):$PATH
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export CUDA_VISIBLE_DEVICES=""
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$CPU_HOST_KIT
