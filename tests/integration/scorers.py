"""Scorer services for tests: the real FastAPI app on a free port of 127.0.0.1 (in a thread),
a tiny random sequence-classification checkpoint to host, and a stdlib stub that misbehaves."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.jobs.conftest import free_port

WORDS = [
    "the",
    "a",
    "is",
    "to",
    "how",
    "do",
    "i",
    "you",
    "can",
    "help",
    "make",
    "safe",
    "unsafe",
    "bomb",
    "cake",
    "water",
    "sorry",
]


def tiny_checkpoint(
    folder: Path, num_labels: int, seed: int, initializer_range: float = 0.02
) -> Path:
    """A 2-layer random BERT classifier with a word-level vocabulary: real, small, fast
    (a larger `initializer_range` spreads its scores far apart)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(WORDS) + 5,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=num_labels,
        initializer_range=initializer_range,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


@dataclass
class Scorer:
    url: str
    server: object  # uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def running_scorer(
    reward_model: Path,
    cost_model: Path,
    max_wait_s: float = 0.01,
    token: str | None = None,
    **model_options: object,
) -> Iterator[Scorer]:
    """The real scorer app under uvicorn on 127.0.0.1 (a thread), requiring `token` when
    given, its models built with `model_options` (ScoringModel's); stops on exit."""
    import uvicorn

    from scorer.models import ScoringModel
    from scorer.service import create_app

    app = create_app(
        ScoringModel(reward_model, **{"batch_size": 4, **model_options}),
        ScoringModel(cost_model, **{"batch_size": 4, **model_options}),
        max_wait_s=max_wait_s,
        token=token,
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the scorer did not start")
        time.sleep(0.05)
    scorer = Scorer(f"http://127.0.0.1:{port}", server, thread)
    try:
        yield scorer
    finally:
        scorer.stop()


Handler = Callable[[dict], tuple[int, bytes]]


@contextmanager
def stub_scorer(answer: Handler, delay_s: float = 0.0) -> Iterator[str]:
    """An HTTP server whose /score_batch answers `answer(request_json)` after `delay_s`."""

    class Stub(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay_s)
            status, payload = answer(body)
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except BrokenPipeError:
                pass  # the client gave up first (the timeout test)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        # shutdown() waits for serve_forever to say it stopped, forever if its thread is
        # already gone; once, in a full suite, it was.
        if thread.is_alive():
            server.shutdown()
        server.server_close()
