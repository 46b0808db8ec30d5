"""Best-of-n evaluation: how proxy and gold scores move as n grows (over-optimisation).

- estimator: the unbiased best-of-n estimator (pure numpy)
- evaluation: sample a checkpoint's answers with vLLM and score them (`eslab bon`)
"""
