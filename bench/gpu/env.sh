# Source on the GPU machine before anything that starts vLLM 0.26 there (see README, "ES Lab
# on a GPU"): the wheels installed by install.sh, this checkout, and the environment vLLM
# needs there (without the first three it hung at start; without the last it imports
# flashinfer, which is not carried).
export PYTHONPATH=/root/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export VLLM_HOST_IP=127.0.0.1 GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
