"""vLLM on CUDA, made fit for ES: every weight operation of a member in one kernel launch.

- kernels: the Triton kernels (perturb, restore, update, fingerprint) over a list of tensors
- weights: a worker's tensors laid out as the kernels' job list, and the calls that launch them
- lora_configs: the configurations of vLLM's multi-LoRA kernels that keep LoRA runs
  deterministic (tuned ones per card in tuned_lora/)
- member_noise: the full_batched members' noise products, one kernel a linear layer
"""
