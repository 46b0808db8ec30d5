"""bench/gpu/profile_step.py's summary of a CUDA profile: kernels sorted into kinds by name
and the GPU's busy time as the union of their intervals."""

from bench.gpu import profile_step


def test_kernels_are_sorted_into_kinds_by_their_names():
    fa3 = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
    assert profile_step.kind(fa3) == "attention"  # cutlass and sm90, yet attention
    assert profile_step.kind("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT") == "matmul"
    assert profile_step.kind("_lora_expand_kernel") == "lora"
    assert profile_step.kind("member_noise_kernel") == "member noise"  # not lora's, not other
    assert profile_step.kind("_gumbel_sample_kernel") == "sampling"
    assert profile_step.kind("triton_red_fused_fused_add_rms_norm_2") == "other"


def test_busy_time_counts_overlapping_kernels_once():
    assert profile_step.busy_seconds([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 4.0
    assert profile_step.busy_seconds([]) == 0.0


def test_a_wait_is_named_by_the_code_outside_torch_that_made_it():
    import traceback

    stack = [
        traceback.FrameSummary("/x/engine/trainer/loop.py", 10, "step"),
        traceback.FrameSummary("/site/vllm/lora/meta.py", 20, "prepare_tensors"),
        traceback.FrameSummary("/site/torch/_tensor.py", 30, "item"),
        traceback.FrameSummary("/usr/lib/python3.12/warnings.py", 40, "_showwarnmsg"),
    ]
    assert profile_step.code_site(stack, depth=2) == (
        "lora/meta.py:20(prepare_tensors) < trainer/loop.py:10(step)"
    )
