"""vLLM's CPU build, made fit for ES: live weights and fast multi-LoRA.

- weights: linear kernels that read the layer's weight on every call (so in-place
  perturbations take effect), fp32 linears on CPUs without bf16 hardware
- lora_kernels: grouped multi-LoRA shrink/expand in place of vLLM's per-token copies
- native: the per-token C kernel (lora_tokens.c), built at first use
- features: what this CPU computes in hardware
"""
