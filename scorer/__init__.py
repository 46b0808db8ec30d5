"""The alignment scorer service: reward and cost models behind HTTP.

After the alignment scorer of the jbejjani2022 fork of es-fine-tuning-paper
(`alignment/scorer_service.py`), with its endpoints: `GET /health`, `POST /score_batch` and
`/score` `{prompts, responses}` -> `{rewards, costs}`, `POST /score_texts {texts}`, so the
(GPU-hungry) reward and cost models live in one process that every vLLM engine calls, and the
reference's client scripts can call it too. The models read the prompt and the response as a
text pair (the tokenizer's two segments; ES Lab's default models) or, with
`--input-format conversation`, as the reference's one conversation text.

It is a process of its own, started by `eslab scorer serve`; training runs reach it only over
HTTP, through `engine.scoring.client`.

- models: any Hugging Face sequence-classification checkpoint -> one score per (prompt, response)
- conversation: the reference's "BEGINNING OF CONVERSATION: USER: ... ASSISTANT:" format
- batcher: requests that arrive together are scored together
- service: the FastAPI app and `serve`
- default, default_data: `eslab scorer train-default`, the offline MiniLM reward and cost pair
"""
