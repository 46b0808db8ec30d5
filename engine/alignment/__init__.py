"""Alignment runs: fitness mean(R) - lambda * mean(C) with an adaptive Lagrange multiplier.

- lagrangian: the objective and the lambda rule, as pure functions
- aligner: the per-run state the trainer holds (lambda, the J_C average) and the step's metrics
- kl: a checkpoint's per-token KL to its base model (`eslab kl`)
"""
