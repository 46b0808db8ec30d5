"""The alignment scorer: reward and cost models behind an HTTP service, and its client.

After the jbejjani2022 fork's `alignment/scorer_service.py` (shared/reference/
seed-algorithms.md, section 2): `GET /health` and `POST /score_batch {prompts, responses}` ->
`{rewards, costs}`, so the (GPU-hungry) reward and cost models live in one process that every
vLLM engine calls. Unlike the reference, the prompt and the response reach the models as a
text pair (the tokenizer's two segments) rather than one pre-formatted conversation, and the
client never turns a failure into zero scores.

- models: any Hugging Face sequence-classification checkpoint -> one score per (prompt, response)
- service: the FastAPI app and `serve` (`eslab scorer serve`)
- client: batching, timeout and retries; every failure is a ScorerError naming the URL
- default: `eslab scorer train-default`, the offline MiniLM reward and cost pair
"""
