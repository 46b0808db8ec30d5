"""Low-rank population mode (`perturbation: lora`): each member is a seeded rank-r adapter.

- factors: the math (seeded factors, per-layer noise scale, the update, adapter files)
- population: the trainer's side (members into the engines' LoRA slots, one generate call,
  the update merged into the weights or kept as a trained adapter)

The engine's side lives in engine/backends/vllm/lora_slots.py.
"""
