# Source on the GPU machine before anything that starts vLLM 0.26 there (see docs/gpu.md): the
# wheels installed by install.sh, this checkout, the data folder (the default model that
# install.sh builds, runs, the database) and the environment vLLM needs there (without the
# VLLM_HOST_IP/GLOO/NCCL settings it hung at start; without the flashinfer one it imports
# flashinfer, which is not carried).
export PYTHONPATH=/root/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/root/site/bin:$PATH
export ESLAB_DATA_DIR=${ESLAB_DATA_DIR:-/root/data}
export VLLM_HOST_IP=127.0.0.1 GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# NVLink multicast stays off on shared multi-GPU hosts (a program using it can take the host's
# GPUs out of service); vLLM's all-reduce of tensor_parallel_size > 1 then uses its custom
# all-reduce or NCCL's ring.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_ALLREDUCE_USE_SYMM_MEM=0
