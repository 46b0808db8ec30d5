"""A full-rank population generating in ONE engine whose members share the weight reads:
what would its generation reach inside vLLM, host and all?

    python3 bench/gpu/shared_noise_engine.py MODEL_DIR [--population 32] [--prompts 8]
        [--max-tokens 128] [--rounds 3] [--json FILE]

Today every full-rank member generates on an engine that holds its perturbed weights, so a
card runs several engines under MPS, each reading all the weights for its member's 8
sequences (docs/gpu.md, "Engines auto"). bench/gpu/shared_reads.py times the alternative's
linear layers alone: the unperturbed product of every member's tokens at once, plus each
member's noise product read from the noise table. This runs that alternative inside vLLM:
one in-process engine of the unperturbed model, in which every linear layer and the LM head
add, after vLLM's own product, each member's noise product (shared_reads'
`add_noise_product`, 64x64 tiles) through a custom op that vLLM's CUDA graphs capture. The
batch's rows are taken as the members' tokens in order (member m: rows m * prompts onwards)
at every forward pass of at most population x prompts rows, the decode steps; the longer
prefill passes stay plain. A fused layer (qkv, gate_up) takes one noise block.

It measures the cost of such a step's generation, not the product: which row belongs to
which member is not tracked (a sequence that ends early shifts the rows after it), and the
norms and the embedding, which full rank also perturbs, add no noise here (a few thousand
entries a layer, and the embedding is read one row a token). The members' text is not what
their perturbed weights would give.

Three parts in each round, on one engine and the same prompts, switched by a flag on the
GPU so that one set of CUDA graphs serves them all (a switched-off kernel reads nothing):

- reference: the kernels off, plain vLLM (utilization.py's reference call);
- members: every member its own noise block, at an offset drawn anywhere in the table, as
  engine.noise hashes them;
- pairs: antithetic pairs (`antithetic: true`), one block for members m and m + population/2.

Prints each part's median seconds and tokens/s over --rounds and its time against the
reference's (the reference's time over a part's is the utilization that part's generation
would have), and, from one untimed call of each part, the share of sequences whose greedy
tokens differ from the reference's: 0 would say the kernels never ran.
"""

import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_overhead import rounds_arguments, summary
from shared_reads import add_noise_product
from utilization import (
    batch_prompts,
    common_options,
    full_rank_pool,
    plain_call,
    timed_generate,
)

PARTS = {"reference": 0, "members": 1, "pairs": 2}
"""Each part's value of the flag; the kernels of `members` run at 1, those of `pairs` at 2."""
TABLE_LEN = 2**28
"""Entries of the bench's noise table (bf16, 512 MiB): at least twice the largest tensor of
the models measured (the 1.07B model's embedding, 100.7M), as engine.noise sizes its table."""
TILE = (64, 64)
"""Rows and columns of the noise product's tiles: the fastest of bench/gpu/shared_reads.py's
for the members' noise on an H100 at both models (bench/gpu/results/shared-reads/)."""
SCALE = 0.01


@dataclass
class MemberNoise:
    """What the custom op reads: the table, each layer's members' offsets, the scales and the
    flag, all made on the model's device while vLLM loads it (before any CUDA graph)."""

    members: int
    tokens: int
    table: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    flag: torch.Tensor | None = None
    offsets: list[torch.Tensor] = field(default_factory=list)

    def register(self, layer: torch.nn.Module) -> None:
        """Give `layer` an index and its members' noise offsets."""
        weight = layer.weight
        if self.table is None:
            gen = torch.Generator(device=weight.device).manual_seed(0)
            self.table = torch.randn(
                TABLE_LEN, generator=gen, device=weight.device, dtype=torch.bfloat16
            )
            self.scales = torch.full((self.members,), SCALE, device=weight.device)
            self.flag = torch.zeros(1, dtype=torch.int32, device=weight.device)
        if 2 * weight.numel() > TABLE_LEN:
            raise ValueError(f"a {tuple(weight.shape)} weight needs a table of 2x its entries")
        high = TABLE_LEN - weight.numel() + 1
        self.offsets.append(torch.randint(0, high, (self.members,), device=weight.device))
        layer.eslab_noise_index = len(self.offsets) - 1

    def add(self, out: torch.Tensor, x: torch.Tensor, index: int) -> None:
        """Each member's noise product into `out`, by the flag's part (see the module)."""
        members = x.shape[0] // self.tokens
        if x.shape[0] > self.members * self.tokens or not members:
            return
        x = x.contiguous()
        offsets = self.offsets[index]
        product = (self.table, offsets[:members], self.scales, out, self.tokens, *TILE)
        add_noise_product(x, *product, False, self.flag, PARTS["members"])
        if members >= 2:
            pairs = (self.table, offsets[: members // 2], *product[2:])
            add_noise_product(x, *pairs, True, self.flag, PARTS["pairs"])


NOISE: MemberNoise | None = None


def install(members: int, tokens: int) -> MemberNoise:
    """Put the member noise into vLLM's unquantized linear layers and LM head: every such
    layer loaded from now on gets its offsets, and its product adds the noise."""
    global NOISE
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.utils.torch_utils import direct_register_custom_op

    NOISE = MemberNoise(members, tokens)
    direct_register_custom_op(
        op_name="eslab_member_noise",
        op_func=_member_noise_op,
        mutates_args=["out"],
        fake_impl=_member_noise_fake,
    )
    for method in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
        method.process_weights_after_loading = _registering(method.process_weights_after_loading)
        method.apply = _adding_noise(method.apply)
    return NOISE


def _registering(process):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        process(self, layer)
        NOISE.register(layer)

    return process_weights_after_loading


def _adding_noise(apply):
    def apply_with_noise(self, layer, x, bias=None):
        out = apply(self, layer, x, bias)
        index = getattr(layer, "eslab_noise_index", None)
        if index is not None:
            torch.ops.vllm.eslab_member_noise(out, x, index)
        return out

    return apply_with_noise


def _member_noise_op(out: torch.Tensor, x: torch.Tensor, index: int) -> None:
    """The op's body: opaque to torch.compile, captured into the CUDA graphs."""
    NOISE.add(out, x, index)


def _member_noise_fake(out: torch.Tensor, x: torch.Tensor, index: int) -> None:
    """The op's shape function for torch.compile: it only writes `out` in place."""


def changed_share(engine, prompts: list, flag: torch.Tensor, part: str) -> float:
    """Share of sequences whose greedy tokens (16 of them) differ from the reference's."""
    answers = {}
    for name in ("reference", part):
        flag.fill_(PARTS[name])
        _, outputs = timed_generate(engine, prompts, 16)
        answers[name] = [tuple(out.outputs[0].token_ids) for out in outputs]
    flag.fill_(PARTS["reference"])
    pairs = zip(answers["reference"], answers[part], strict=True)
    return sum(a != b for a, b in pairs) / len(prompts)


def main() -> None:
    args = rounds_arguments(__doc__.split("\n\n")[0])
    noise = install(args.population, args.prompts)
    pool = full_rank_pool(args, 1, common_options(args))
    engine = pool._local
    prompts = batch_prompts(args.population * args.prompts)
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    tokens: dict[str, list[int]] = {part: [] for part in PARTS}
    try:
        plain_call(engine, prompts, 8)  # warm-up at the full batch
        changed = {part: changed_share(engine, prompts, noise.flag, part) for part in PARTS}
        for _ in range(args.rounds):
            for part, value in PARTS.items():
                noise.flag.fill_(value)
                seconds, n = plain_call(engine, prompts, args.max_tokens)
                times[part].append(seconds)
                tokens[part].append(n)
    finally:
        noise.flag.fill_(PARTS["reference"])
        pool.shutdown()
    import vllm

    result = {
        "card": torch.cuda.get_device_name(),
        "vllm": vllm.__version__,
        "host": platform.node(),
        "model": args.model,
        "population": args.population,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "layers": len(noise.offsets),
        "rows": summary(times, tokens),
        "sequences_changed": changed,
        "command": " ".join(sys.argv),
    }
    print(
        f"{result['card']}, {args.model}: {args.population} members x {args.prompts} prompts "
        f"in one engine, {args.max_tokens} tokens, {args.rounds} rounds (median); "
        f"{len(noise.offsets)} layers add member noise"
    )
    for part, row in result["rows"].items():
        print(
            f"  {part:10s} {row['median_s']:7.3f} s  {row['tokens_per_s']:9,.0f} tokens/s"
            f"  x{row['x_reference']:5.2f}  utilization {1 / row['x_reference']:.2f}"
            f"  sequences changed {changed[part]:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
