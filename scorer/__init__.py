"""The alignment scorer service: reward and cost models behind HTTP.

After the alignment scorer of the jbejjani2022 fork of es-fine-tuning-paper
(`alignment/scorer_service.py`): `GET /health` and `POST /score_batch {prompts, responses}` ->
`{rewards, costs}`, so the (GPU-hungry) reward and cost models live in one process that every
vLLM engine calls. Unlike the reference, the prompt and the response reach the models as a
text pair (the tokenizer's two segments) rather than one pre-formatted conversation.

It is a process of its own, started by `eslab scorer serve`; training runs reach it only over
HTTP, through `engine.scoring.client`.

- models: any Hugging Face sequence-classification checkpoint -> one score per (prompt, response)
- batcher: requests that arrive together are scored together
- service: the FastAPI app and `serve`
- default, default_data: `eslab scorer train-default`, the offline MiniLM reward and cost pair
"""
