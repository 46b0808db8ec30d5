"""bench/gpu/lora_kernel_tune.py's logic that needs no GPU: the shapes vLLM's LoRA layers
have, the candidates (shrink never split over K), the adapters' tokens and the JSON layout
vLLM reads."""

import json

from bench.gpu import lora_kernel_tune as tune


def test_shapes_are_vllms_fused_lora_layers(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 2048,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 8192,
            }
        )
    )
    shapes = {s.name: (s.in_features, s.out_slices) for s in tune.lora_shapes(tmp_path)}
    assert shapes == {
        "qkv_proj": (2048, (2048, 512, 512)),
        "o_proj": (2048, (2048,)),
        "gate_up_proj": (2048, (8192, 8192)),
        "down_proj": (8192, (2048,)),
    }


def test_shrink_candidates_never_split_k_and_expand_ones_take_no_split():
    shrink = list(tune.candidates(tune.SHRINK_SPACE, "shrink"))
    expand = list(tune.candidates(tune.EXPAND_SPACE, "expand"))
    assert shrink and all(c["split_k"] == 1 for c in shrink)
    assert expand and all("split_k" not in c for c in expand)
    assert len({json.dumps(c, sort_keys=True) for c in shrink}) == len(shrink)


def test_each_adapter_gets_its_tokens_side_by_side():
    assert tune.token_mapping(8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert tune.token_mapping(5, 2) == [0, 0, 0, 1, 1]


def test_configurations_nest_as_vllm_reads_them():
    a, b = {"block_m": 16}, {"block_m": 32}
    nested = tune.nest({(33, 3, 256, 2048, 4): a, (33, 3, 64, 2048, 4): b})
    assert nested == {"33": {"3": {"64": {"2048": {"4": b}}, "256": {"2048": {"4": a}}}}}
    assert tune.card_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"


def test_a_second_run_into_the_same_folder_continues_from_what_the_first_wrote(tmp_path):
    assert tune.earlier_results(tmp_path) == []
    found = {"model": "m", "op": "shrink", "shape": "o_proj", "key": [33, 1, 64, 2048, 4]}
    found |= {"default_ms": 0.05, "best_ms": 0.01, "config": {"block_m": 16}}
    tuned = {"shrink": {(33, 1, 64, 2048, 4): {"block_m": 16}}, "expand": {}}
    tune.write(tmp_path, "NVIDIA_H200", tuned, [found])
    assert tune.earlier_results(tmp_path) == [found]
    shrink = json.loads((tmp_path / "NVIDIA_H200_SHRINK.json").read_text())
    assert shrink["33"]["1"]["64"]["2048"]["4"] == {"block_m": 16}
    assert (tmp_path / "NVIDIA_H200_EXPAND_TRUE.json").is_file()
