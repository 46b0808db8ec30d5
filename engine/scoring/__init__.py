"""Turning a batch of completions into rewards (and, for alignment, costs).

- batch: ScoredBatch, and scoring a batch with one reward function
- sources: where a run's reward comes from: a reward function, the scorer service, or an
  ensemble of both
- members: what `ensemble_members` says (one parser for the rules and the scoring)
- ensembles: combining several reward models' scores (mean, min, uwo)
- client: the scorer service's client (batching, timeout, retries; every failure is a
  ScorerError naming the URL, never zero scores)
"""
