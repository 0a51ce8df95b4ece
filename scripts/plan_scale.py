"""Will it fit? Compile the real train step of the large presets for TPU v5e and v5p topologies
(8 to 1,024 chips) with libtpu's compiler, on this host, and tabulate per-chip memory.

    python scripts/plan_scale.py                    # every row, skipping those already written
    python scripts/plan_scale.py --only=gpt3,bert --redo  # recompile rows naming gpt3 or bert
    python scripts/plan_scale.py --table=maxtext    # MaxText's published recipes: maxtext.md
    python scripts/plan_scale.py --table=fit        # --fit's answers for two of them: fit.md

Each row is one `python -m transformers_jax.train --compile_only --config.mesh.topology=...`
run (bf16 compute, float32 parameters and Adam state, scanned layers, full remat unless the row
says otherwise). Writes experiments/results/scale/tpu.json (one object per row, what
--compile_only printed) and tpu.md (the table). "step at 50% MFU" is model FLOPs over half the
chips' data-sheet bf16 peak: a yardstick, not a measurement. Needs the `tpu` extra.
"""

from __future__ import annotations

import math


from absl import flags

from transformers_jax import cli
from transformers_jax.config import load_config_module
from transformers_jax.errors import UserError
from transformers_jax.scripting import bench_report, output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string(
    "out", "experiments/results/scale", "Folder for tpu.json and tpu.md.", flag_values=FLAGS
)
flags.DEFINE_list(
    "only", [], "Compile only the rows whose name contains one of these texts.", flag_values=FLAGS
)
flags.DEFINE_bool("redo", False, "Recompile rows already in tpu.json.", flag_values=FLAGS)
flags.DEFINE_enum(
    "table",
    "presets",
    ["presets", "maxtext", "fit"],
    "presets: this project's presets (tpu.json, tpu.md); maxtext: MaxText's published recipes "
    "with their shapes, meshes, batches and remat policies (maxtext.json, maxtext.md); fit: "
    "what --fit chooses for MaxText's 32B and 1M-token recipes from this project's default "
    "flags (fit.json, fit.md).",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "fit_cache",
    None,
    "--table=fit: the --fit compile cache (a rerun of the same rows compiles nothing).",
    flag_values=FLAGS,
)
flags.DEFINE_integer(
    "timeout",
    900,
    "Seconds one compile may take before it is given up.",
    lower_bound=1,
    flag_values=FLAGS,
)

COMMON = [
    "--config.model.dtype=bfloat16",
    "--config.model.scan_layers=True",
    "--config.mesh.preset=",
    "--config.mesh.expert=1",
]


def row(
    name,
    config,
    topology,
    batch,
    seq_len,
    fsdp,
    tensor=1,
    data=1,
    remat="full",
    context=1,
    extra=(),
    expert=1,
):
  """One compile: `batch` sequences of `seq_len` tokens (images for ViT) per step, each split
  over `context` chips. Rows of up to 2,048 tokens take einsum attention unless `extra` says
  otherwise: they were measured with it before `auto` took TPU splash attention, and their
  figures reproduce so (splash only lowers their temporaries)."""
  if seq_len <= 2048 and not any("attention_impl" in a for a in extra):
    extra = [*extra, "--config.model.attention_impl=einsum"]
  return {
      "name": name,
      "config": config,
      "topology": topology,
      "remat": remat,
      "args": [
          f"--config={config}",
          f"--config.mesh.topology={topology}",
          f"--config.batch_size={batch}",
          f"--config.seq_len={seq_len}",
          f"--config.mesh.data={data}",
          f"--config.mesh.fsdp={fsdp}",
          f"--config.mesh.tensor={tensor}",
          *([f"--config.mesh.context={context}"] if context > 1 else []),
          f"--config.model.remat={remat}",
          *(
              a if a != "--config.mesh.expert=1" else f"--config.mesh.expert={expert}"
              for a in COMMON
          ),
          *extra,
      ],
  }


ROWS = [
    # GPT-2 (1,024 tokens per sequence)
    row("gpt2-small v5e-8", "experiments/gpt2.py:small", "v5e:2x4", 64, 1024, 8),
    row("gpt2-medium v5e-8", "experiments/gpt2.py:medium", "v5e:2x4", 64, 1024, 8),
    row("gpt2-xl v5e-16", "experiments/gpt2.py:xl", "v5e:4x4", 64, 1024, 16),
    row("gpt2-xl v5p-8", "experiments/gpt2.py:xl", "v5p:2x2x2", 64, 1024, 8),
    # GPT-3 (2,048 tokens per sequence); 2.7B at one sequence per chip on 8, 64, 512 chips
    row("gpt3-2.7b v5p-8", "experiments/gpt3.py:2.7b", "v5p:2x2x2", 8, 2048, 8),
    row("gpt3-2.7b v5p-64", "experiments/gpt3.py:2.7b", "v5p:4x4x4", 64, 2048, 64),
    row("gpt3-2.7b v5p-512", "experiments/gpt3.py:2.7b", "v5p:8x8x8", 512, 2048, 512),
    row("gpt3-6.7b v5e-64", "experiments/gpt3.py:6.7b", "v5e:8x8", 64, 2048, 64),
    row("gpt3-6.7b v5p-64", "experiments/gpt3.py:6.7b", "v5p:4x4x4", 64, 2048, 64),
    # GPT-3 13B's listed d_model, 5,140, is 4 x 5 x 257: no FSDP axis wider than 20 divides it.
    # These rows use 5,120 (its 40 heads x 128), as most reimplementations do.
    row(
        "gpt3-13b (d_model 5,120) v5p-64",
        "experiments/gpt3.py:13b",
        "v5p:4x4x4",
        64,
        2048,
        64,
        extra=["--config.model.d_model=5120"],
    ),
    row(
        "gpt3-13b (d_model 5,120) v5e-256",
        "experiments/gpt3.py:13b",
        "v5e:16x16",
        256,
        2048,
        256,
        extra=["--config.model.d_model=5120"],
    ),
    row("gpt3-175b v5p-64", "experiments/gpt3.py:175b", "v5p:4x4x4", 64, 2048, 16, tensor=4),
    # the compiler refuses this one (exit 3): 2.8 TB of parameters and Adam state on 64 x 16 GB
    row("gpt3-175b v5e-64", "experiments/gpt3.py:175b", "v5e:8x8", 64, 2048, 16, tensor=4),
    row("gpt3-175b v5p-1024", "experiments/gpt3.py:175b", "v5p:8x8x16", 1536, 2048, 256, tensor=4),
    # BERT-large (512 tokens), ViT-H/14 (257 tokens per image), Transformer big (256 + 256)
    row(
        "bert-large v5e-8",
        "experiments/bert.py:large",
        "v5e:2x4",
        256,
        512,
        8,
        extra=["--config.model.head=mlm"],
    ),
    row(
        "bert-large v5p-8",
        "experiments/bert.py:large",
        "v5p:2x2x2",
        256,
        512,
        8,
        extra=["--config.model.head=mlm"],
    ),
    row("vit-h14 v5e-16", "experiments/vit.py:h14", "v5e:4x4", 512, 257, 16),
    row("vit-h14 v5p-8", "experiments/vit.py:h14", "v5p:2x2x2", 512, 257, 8),
    row("transformer-big v5e-8", "experiments/transformer.py:big", "v5e:2x4", 128, 256, 8),
    row("transformer-big v5p-8", "experiments/transformer.py:big", "v5p:2x2x2", 128, 256, 8),
    # Long context: GPT-3 6.7B with its position table stretched (model.max_len), one sequence
    # per fsdp group. Attention is `auto` (TPU splash attention; flash over a context axis)
    # unless the row says einsum, the reference that writes every score out.
    *[
        row(
            f"gpt3-6.7b {n // 1024}k{' (einsum attention)' if impl else ''} v5p-64",
            "experiments/gpt3.py:6.7b",
            "v5p:4x4x4",
            64,
            n,
            64,
            extra=[f"--config.model.max_len={n}", *impl],
        )
        for n, impl in (
            (8192, ["--config.model.attention_impl=einsum"]),
            (8192, []),
            (32768, ["--config.model.attention_impl=einsum"]),
            (32768, []),
        )
    ],
    # 131,072 tokens per sequence, split over a context axis of 8 chips (zig-zag balanced)
    row(
        "gpt3-6.7b 128k context 8 v5p-512",
        "experiments/gpt3.py:6.7b",
        "v5p:8x8x8",
        64,
        131072,
        64,
        context=8,
        extra=["--config.model.max_len=131072"],
    ),
    # the same sequences on 64 chips: 8 at a time, parameters and Adam state over fsdp 8
    row(
        "gpt3-6.7b 128k context 8 v5p-64",
        "experiments/gpt3.py:6.7b",
        "v5p:4x4x4",
        8,
        131072,
        8,
        context=8,
        extra=["--config.model.max_len=131072"],
    ),
    # gpt-oss-120b (116.8B: 128 clamped-SwiGLU experts of 2,880, 4 routed; attention sinks, a
    # window of 128 on every other block) on the smallest v5p slice its float32 parameters and
    # Adam state (1.87 TB with the gradients) fit: 32 chips, experts over 4 of them (tokens
    # travel by all-to-all), everything over fsdp 8; one sequence of 4,096 tokens per chip
    row(
        "gpt-oss-120b expert 4 v5p-32",
        "experiments/gpt_oss.py:120b",
        "v5p:2x4x4",
        32,
        4096,
        8,
        extra=["--config.mesh.expert=4"],
    ),
    # Llama 4 Maverick (400.7B: 128 SwiGLU experts of 8,192 and a shared one in every second
    # block, dense SwiGLU blocks of 16,384 between, chunked attention over 8,192 tokens with
    # every fourth block NoPE) with float32 parameters and Adam state (6.4 TB with the
    # gradients): experts over 16 chips (8 each), everything over fsdp; one sequence of 4,096
    # tokens per chip, the logits an 8th at a time, the experts' receive buffers sized by a
    # capacity of 1.25; on v5p-512, v5p-256 and v5p-128. The smallest that fits is v5p-512
    # (XLA peak 90.0 GiB); v5p-256 is refused for 114 GiB of temporaries (117 dropless)
    *(
        row(
            f"Llama 4 Maverick expert 16 x fsdp {chips // 16} {label}",
            "experiments/llama4.py:maverick",
            topology,
            chips,
            4096,
            chips // 16,
            expert=16,
            extra=[
                "--config.model.moe_dropless=False",
                "--config.model.capacity_factor=1.25",
                "--config.loss_chunks=8",
            ],
        )
        for label, topology, chips in (
            ("v5p-512", "v5p:8x8x4", 256),
            ("v5p-256", "v5p:4x4x8", 128),
            ("v5p-128", "v5p:4x4x4", 64),
        )
    ),
]


# MaxText's published recipes (its README's v5p tables and configs), compiled with the same
# model shape, topology, per-chip batch and sequence length and the same remat policy. Llama
# shapes: RMSNorm, RoPE, SwiGLU, no biases, untied 32,000-token head. MaxText splits the
# activations' embedding axis over the tensor axis (its activation_embed rule), which
# --config.rules.act_embed=tensor does here; loss_chunks=8 makes the logits an 8th at a time.
LLAMA = [
    "--config.model.activation=swiglu",
    "--config.model.positions=rope",
    "--config.model.norm=rmsnorm",
    "--config.model.use_bias=False",
    "--config.model.vocab_size=32000",
    "--config.model.tie_embeddings=False",
    "--config.loss_chunks=8",
]


def llama(layers, d_model, heads, d_ff, seq_len, kv_heads=None, extra=()):
  """A Llama-style shape on gpt3.py's 6.7b preset (its training fields), as overrides."""
  return [
      *LLAMA,
      f"--config.model.num_layers={layers}",
      f"--config.model.d_model={d_model}",
      f"--config.model.num_heads={heads}",
      *([f"--config.model.num_kv_heads={kv_heads}"] if kv_heads else []),
      f"--config.model.d_ff={d_ff}",
      f"--config.model.max_len={seq_len}",
      *extra,
  ]


def chips_in(topology: str) -> int:
  """The chips of one slice of a v5p topology ("v5p:4x4x4" -> 64)."""
  return math.prod(int(n) for n in topology.split(":")[1].split("x"))


def recipe(
    name, source, topology, per_chip, seq_len, fsdp, remat, shape, tensor=1, extra=(), slices=1
):
  """A MaxText recipe's row: `per_chip` sequences per chip of `seq_len` tokens, on `slices`
  slices of `topology`."""
  chips = chips_in(topology) * slices
  r = row(
      name,
      "experiments/gpt3.py:6.7b",
      topology,
      per_chip * chips,
      seq_len,
      fsdp,
      tensor=tensor,
      remat=remat,
      extra=[*shape, *extra, "--config.model.attention_impl=auto"],
  )
  r["source"] = source
  return r


def long_context(name, topology, batch, seq_len, strategy, source):
  """Llama-3.1-8B with each sequence split over every chip of `topology` (the context axis),
  parameters and optimizer state split over that axis too, full remat."""
  chips = chips_in(topology)
  r = row(
      name,
      "experiments/llama.py:3.1-8b",
      topology,
      batch,
      seq_len,
      1,
      context=chips,
      extra=[
          f"--config.model.max_len={seq_len}",
          f"--config.model.context_strategy={strategy}",
          "--config.rules.embed=fsdp,context",
          "--config.loss_chunks=16",
          "--config.model.attention_impl=auto",
      ],
  )
  return {**r, "source": source}


# MaxText's 32B: fsdp 16 x tensor 4 on v5p:4x4x4, 6 x 2,048 tokens per chip, remat minimal;
# with its activation sharding, and with this project's default (activations' embedding whole)
MAXTEXT_32B = [
    recipe(
        f"32B llama minimal{label} v5p-64",
        source,
        "v5p:4x4x4",
        6,
        2048,
        16,
        "minimal",
        llama(32, 8192, 64, 28672, 2048),
        tensor=4,
        extra=rules,
    )
    for label, source, rules in (
        (
            "",
            "MaxText v5p 32B: 71.5% MFU, fsdp 16 x tensor 4, 6 x 2,048 per chip, remat minimal",
            ["--config.rules.act_embed=tensor"],
        ),
        (
            ", activations whole over tensor",
            "the same, with this project's default rules (activations' embedding replicated)",
            [],
        ),
    )
]
MAXTEXT_32B[0]["flops_policies"] = ("minimal", "full")
MAXTEXT_ROWS = [
    *MAXTEXT_32B,
    recipe(
        "Llama-2 70B save_dot_except_mlpwi v5p-256",
        "MaxText v5p Llama-2 70B: 65.4% MFU, fsdp 256, 4 x 4,096 per chip",
        "v5p:4x8x8",
        4,
        4096,
        256,
        "save_dot_except_mlpwi",
        llama(80, 8192, 64, 28672, 4096, kv_heads=8),
    )
    | {"flops_policies": ("save_dot_except_mlpwi", "full")},
    recipe(
        "Mixtral 8x7B full v5p-64",
        "MaxText v5p Mixtral 8x7B: 52.6% MFU, fsdp 64, 36 x 4,096 per chip, bf16 weights",
        "v5p:4x4x4",
        36,
        4096,
        64,
        "full",
        llama(
            32,
            4096,
            32,
            14336,
            4096,
            kv_heads=8,
            extra=[
                "--config.model.feed_forward=moe",
                "--config.model.num_experts=8",
                "--config.model.top_k=2",
                "--config.model.moe_impl=ragged",
                "--config.model.param_dtype=bfloat16",
            ],
        ),
    )
    | {"flops_policies": ("full",)},
    # MaxText's long-context recipe: Llama-3.1-8B, 2 sequences of 1,048,576 tokens over 64 chips
    # (context 64, no fsdp); parameters and optimizer state split over the context axis as its
    # `embed` rule does; K/V gathered per layer, or passed around the ring in flash blocks
    *(
        long_context(
            f"Llama-3.1-8B 1M tokens context 64 {strategy} v5p-64",
            "v5p:4x4x4",
            2,
            1_048_576,
            strategy,
            "MaxText long context: Llama-3.1-8B, 1M tokens, 64 v5p chips, context 64, "
            "2 sequences",
        )
        for strategy in ("all_gather", "ring")
    ),
    # ... and its longest rows' scale: one sequence of 4,194,304 and of 10,485,760 tokens over
    # 512 chips
    *(
        long_context(
            f"Llama-3.1-8B {label} tokens context 512 ring v5p-512",
            "v5p:8x8x8",
            1,
            length,
            "ring",
            f"MaxText's long-context rows up to 10M tokens: Llama-3.1-8B, one {label}-token "
            "sequence, context 512",
        )
        for label, length in (("4M", 4_194_304), ("10M", 10_485_760))
    ),
    recipe(
        "GPT-3 6.7B two slices v5p-64 x 2",
        "data parallel across 2 slices (dcn_data 2): which collectives cross DCN",
        "v5p:4x4x4",
        1,
        2048,
        64,
        "full",
        ["--config.mesh.num_slices=2", "--config.mesh.dcn_data=2"],
        slices=2,
    )
    | {"flops_policies": ("full",)},
    # DeepSeek-V3 671B with expert parallelism (experts over 16 chips, everything else over 8
    # more by fsdp), MaxText's v5p-256 test shape: 4 x 1,024 tokens per chip, bf16 weights; the
    # experts' receive buffers sized by a capacity (a dropless buffer holds every row a chip
    # may be sent: 16 x 32,768 x 7,168 per layer, 125 GiB of temporaries in all); and on half
    # the chips, which the compiler refuses
    *(
        {
            **row(
                f"DeepSeek-V3 671B expert 16 x fsdp {chips // 16} {label}",
                "experiments/deepseek.py:v3",
                topology,
                4 * chips,
                1024,
                chips // 16,
                expert=16,
                extra=[
                    "--config.model.param_dtype=bfloat16",
                    "--config.model.moe_dropless=False",
                    "--config.model.capacity_factor=1.25",
                    "--config.loss_chunks=8",
                    "--config.model.attention_impl=auto",
                ],
            ),
            "source": "MaxText's DeepSeek-V3 671B on v5p-256: 4 x 1,024 tokens per chip, bf16 "
            "weights; here experts over 16 chips, capacity factor 1.25",
        }
        for label, topology, chips in (
            ("v5p-512", "v5p:8x8x4", 256),
            ("v5p-256", "v5p:4x4x8", 128),
            ("v5p-128", "v5p:4x4x4", 64),
        )
    ),
    {
        **row(
            "GPT-3 175B two slices v5p-512 x 2",
            "experiments/gpt3.py:175b",
            "v5p:8x8x8",
            1536,
            2048,
            128,
            tensor=4,
            extra=[
                "--config.mesh.num_slices=2",
                "--config.mesh.dcn_data=2",
                "--config.model.attention_impl=auto",
            ],
        ),
        "source": "GPT-3 175B data parallel across 2 slices of 512 chips (1,536 x 2,048 tokens)",
    },
    # Pipelined across the 2 slices: each slice one stage of half the blocks (dcn_stage 2,
    # GPipe), fsdp 128 x tensor 4 inside it; the batch in microbatches of one sequence per fsdp
    # group. Only stage-to-stage sends and reductions over `stage` should cross DCN.
    *(
        {
            **row(
                f"{name} pipelined across 2 slices (dcn_stage 2) v5p-512 x 2",
                config,
                "v5p:8x8x8",
                batch,
                seq_len,
                128,
                tensor=4,
                extra=[
                    "--config.mesh.num_slices=2",
                    "--config.mesh.dcn_data=1",
                    "--config.mesh.dcn_stage=2",
                    f"--config.pipeline.microbatches={microbatches}",
                    "--config.model.attention_impl=auto",
                    *extra,
                ],
            ),
            "source": f"{name}, {batch:,} x {seq_len:,} tokens, 2 stages x {microbatches} "
            f"microbatches: bubble 1/{microbatches + 1} = {1 / (microbatches + 1):.1%}",
        }
        for name, config, batch, seq_len, microbatches, extra in (
            ("GPT-3 175B", "experiments/gpt3.py:175b", 1536, 2048, 12, []),
            (
                "Llama-3.1-405B",
                "experiments/llama.py:3.1-405b",
                512,
                2048,
                4,
                [
                    "--config.model.max_len=2048",
                    "--config.rules.act_embed=tensor",
                    "--config.loss_chunks=8",
                ],
            ),
        )
    ),
]


LONG_CONTEXT_1M = next(r for r in MAXTEXT_ROWS if r["name"].startswith("Llama-3.1-8B 1M"))


# --fit from this project's default flags: each MaxText recipe's shape, topology, mesh and
# batch, and nothing of its layout (no remat policy, sharding rule, loss chunks or context
# strategy: --fit searches those), then once more with the recipe's remat policy kept.
def without_layout(args, keep=()):
  layout = ("--config.model.remat=", "--config.rules.", "--config.loss_chunks=")
  layout += ("--config.model.context_strategy=",)
  return [a for a in args if a in keep or not a.startswith(layout)]


FIT_ROWS = [
    {
        "name": "32B llama v5p-64, from default flags",
        "config": MAXTEXT_32B[0]["config"],
        "source": "MaxText's 32B recipe: fsdp 16 x tensor 4, 6 x 2,048 tokens per chip",
        "args": ["--fit", *without_layout(MAXTEXT_32B[0]["args"])],
        "flops_policies": ("full",),
    },
    {
        "name": "32B llama v5p-64, remat minimal as given",
        "config": MAXTEXT_32B[0]["config"],
        "source": "the same, with MaxText's policy set on the command line (kept by --fit)",
        "args": [
            "--fit",
            *without_layout(MAXTEXT_32B[0]["args"], keep=("--config.model.remat=minimal",)),
        ],
        "flops_policies": (),  # the row above measures them
    },
    {
        "name": "Llama-3.1-8B 1M tokens context 64 v5p-64, from default flags",
        "config": "experiments/llama.py:3.1-8b",
        "source": "MaxText's long-context recipe: 2 sequences of 1,048,576 tokens, context 64",
        "args": ["--fit", *without_layout(LONG_CONTEXT_1M["args"])],
        "flops_policies": ("full",),
    },
]


def fit_row(r) -> dict:
  """One --fit search (its report), then the compiled FLOPs per model FLOP of every remat policy
  among the layouts it tried and of the row's reference policies, from loop-free programs of at
  most 8,192 tokens per sequence (train/fit.py's FLOPS_PROGRAM_MAX_TOKENS: einsum attention
  over a million tokens does not compile)."""
  cache = [f"--fit_cache={FLAGS.fit_cache}"] if FLAGS.fit_cache else []
  result = bench_report.compile_only([*r["args"], *cache], FLAGS.timeout)
  result["command"] = "python -m transformers_jax.train --compile_only " + " ".join(r["args"])
  out = {"name": r["name"], "config": r["config"], **result}
  if not r["flops_policies"]:
    return out
  tried = [t["changes"].get("model.remat") for t in result.get("fit", {}).get("tries", [])]
  given = [a.split("=")[1] for a in r["args"] if a.startswith("--config.model.remat=")]
  policies = dict.fromkeys(p for p in (*tried, *given, *r["flops_policies"]) if p and p != "none")
  seq = [int(a.split("=")[1]) for a in r["args"] if a.startswith("--config.seq_len=")]
  capped = [] if seq and seq[-1] <= 8192 else ["--config.seq_len=8192"]
  base = {**r, "args": [a for a in r["args"] if a != "--fit"] + capped}
  out["flops_per_model_flop_by_policy"] = recompute_flops(base | {"flops_policies": policies})
  return out


def fit_markdown(results: list[dict]) -> str:
  lines = [
      "| recipe | source | layouts tried | --fit's flags | per-chip peak GiB (XLA) | HBM GiB | "
      "fits | compiled FLOPs per model FLOP: chosen | by policy | fresh compiles |",
      "|---|---|---:|---|---:|---:|---|---:|---|---:|",
  ]
  sources = {r["name"]: r["source"] for r in FIT_ROWS}
  for r in results:
    fit = r.get("fit", {})
    tries = fit.get("tries", [])
    flops = r.get("flops_per_model_flop")
    lines.append(
        f"| {r['name']} | {sources.get(r['name'], '')} | {len(tries)} | "
        f"`{fit.get('flags') or '(none)'}` | {gib(r.get('per_device_peak_xla_gib'))} | "
        f"{gib(r.get('hbm_gib'))} | {'yes' if r.get('fits') else '**no**'} | "
        f"{flops if isinstance(flops, float) else '—'} | "
        f"{flops_text(r.get('flops_per_model_flop_by_policy'))} | {len(tries) + 2} |"
    )
  lines += ["", "Each search, one line per layout tried (per-chip peak, whether it fits):", ""]
  for r in results:
    lines.append(f"- {r['name']}:")
    for i, t in enumerate(r.get("fit", {}).get("tries", []), 1):
      peak = "—" if t.get("peak_gib") is None else f"{t['peak_gib']:.1f} GiB"
      fits = "fits" if t.get("fits") else "does not fit"
      lines.append(f"  {i}. `{t.get('flags') or '(as given)'}`: {peak}, {fits}")
  commands = [f"- {r['name']}: `{r.get('command', '')}`" for r in results]
  lines += ["", "Commands:", "", *commands, ""]
  return "\n".join(lines)


def compile_row(r) -> dict:
  result = bench_report.compile_only(r["args"], FLAGS.timeout)
  if "exit_code" not in result:  # timed out
    return {"name": r["name"], **result}
  out = {"name": r["name"], "config": r["config"], "remat": r["remat"], **result}
  if r.get("flops_policies"):
    out["flops_per_model_flop"] = recompute_flops(r)
  return out


# XLA's cost analysis counts a loop's body once, so the step's FLOPs are measured on programs
# without loops: the row's shape with 1 and with 2 unrolled layers, the whole logits at once,
# einsum attention, and plain data parallelism over 4 chips, one sequence each (under fsdp or
# tensor parallelism the TPU compiler makes its collective matmuls loops of their own). Their
# difference is one layer's FLOPs (forward, backward and whatever the policy recomputes), the
# rest is the embedding, head and loss, and the row's L layers come to rest + L x layer. Divided
# by the same for the model's own count (models/counting.py, which the MFU figures use) that is
# the compiled FLOPs per model FLOP, the same per chip whatever the mesh; remat=none gives what
# the step costs when nothing is recomputed.
FLOPS_PROGRAM = [
    "--config.model.scan_layers=False",
    "--config.loss_chunks=1",
    "--config.model.attention_impl=einsum",
    "--config.mesh.topology=v5p:2x2x1",
    "--config.batch_size=4",
    "--config.mesh.data=4",
    "--config.mesh.fsdp=1",
    "--config.mesh.tensor=1",
    "--config.mesh.context=1",
    "--config.mesh.num_slices=1",
    "--config.mesh.dcn_data=1",
]


def recompute_flops(r) -> dict:
  """{policy: compiled FLOPs per model FLOP of the row's whole step} for "none" and each policy
  in r["flops_policies"], or {policy: error text} where a compile gave no count."""
  given = [a.split("=")[1] for a in r["args"] if a.startswith("--config.model.num_layers=")]
  path, preset = r["config"].split(":")
  layers = int(given[-1]) if given else load_config_module(path).get_config(preset).model.num_layers
  out = {}
  for policy in ("none", *r["flops_policies"]):
    xla, model = {}, {}
    for depth in (1, 2):
      result = bench_report.compile_only(
          [
              *r["args"],
              *FLOPS_PROGRAM,
              f"--config.model.num_layers={depth}",
              f"--config.model.remat={policy}",
          ],
          FLAGS.timeout,
      )
      xla[depth] = result.get("xla_flops_per_device_per_step")
      model[depth] = result.get("model_flops_per_device_per_step")
      if xla[depth] is None:
        out[policy] = result.get("error") or result.get("xla_flops_omitted") or "no FLOP count"
        break
    else:
      whole = lambda f: f[1] + (layers - 1) * (f[2] - f[1])  # noqa: E731
      out[policy] = round(whole(xla) / whole(model), 4)
  return out


def maxtext_markdown(results: list[dict]) -> str:
  lines = [
      "| recipe | source | policy | per-chip peak GiB | XLA peak GiB | HBM GiB | fits | DCN "
      "collectives (in the program) | compiled FLOPs per model FLOP | compile s |",
      "|---|---|---|---:|---:|---:|---|---|---|---:|",
  ]
  sources = {r["name"]: r.get("source", "") for r in MAXTEXT_ROWS}
  for r in results:
    dcn = r.get("dcn_collectives")
    dcn_text = ", ".join(f"{k} ×{v['count']}" for k, v in dcn.items()) if dcn else "—"
    lines.append(
        f"| {r['name']} | {sources.get(r['name'], '')} | {r.get('remat', '')} | "
        f"{gib(r.get('per_device_peak_estimate_gib'))} | {gib(r.get('per_device_peak_xla_gib'))}"
        f" | {gib(r.get('hbm_gib'))} | {'yes' if r.get('fits') else '**no**'} | {dcn_text} | "
        f"{flops_text(r.get('flops_per_model_flop'))} | {r.get('compile_s', '—')} |"
    )
  commands = [
      f"- {r['name']}: `python -m transformers_jax.train --compile_only "
      + " ".join(x["args"])
      + "`"
      for x in MAXTEXT_ROWS
      for r in [x]
  ]
  return "\n".join(lines) + "\n\nCommands:\n\n" + "\n".join(commands) + "\n"


def flops_text(ratios) -> str:
  """Each policy's compiled FLOPs per model FLOP ("minimal 0.998, full 1.241, none 0.991"), or
  "—" with the reason where a program kept loops (e.g. MoE's ragged matmuls) or did not compile."""
  if not ratios:
    return "—"
  if any(isinstance(v, str) for v in ratios.values()):
    reason = next(v for v in ratios.values() if isinstance(v, str))
    return "— (loops XLA counts once)" if "loop" in reason else f"— ({reason[:80]})"
  order = [p for p in ratios if p != "none"] + ["none"]
  return ", ".join(f"{p} {ratios[p]:.3f}" for p in order)


def gib(x) -> str:
  return "—" if x is None else f"{x:.1f}"


def markdown(results: list[dict]) -> str:
  lines = [
      "| preset | topology | chips | mesh (data×fsdp×tensor) | batch × tokens | per-chip peak "
      "GiB | XLA peak GiB | HBM GiB | fits | compile s | model TFLOP/step | step at 50% MFU |",
      "|---|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|",
  ]
  for r in results:
    if "error" in r and "chips" not in r:
      lines.append(f"| {r['name']} | — | — | — | — | error: {r['error']} | | | | | | |")
      continue
    mesh = r.get("mesh") or {}
    mesh_text = f"{mesh.get('data', '?')}×{mesh.get('fsdp', '?')}×{mesh.get('tensor', '?')}"
    if mesh.get("context", 1) > 1:
      mesh_text += f", context {mesh['context']}"
    if mesh.get("expert", 1) > 1:
      mesh_text += f", expert {mesh['expert']}"
    per_seq = r["tokens_per_step"] // r["batch_size"]
    step = r.get("step_s_at_50pct_mfu")
    tflop = r.get("model_flops_per_step")
    preset = r["config"].split("/")[-1]
    if "(" in r["name"]:  # a row that changes the preset says how
      preset += " " + r["name"][r["name"].index("(") : r["name"].index(")") + 1]
    lines.append(
        f"| {preset} | {r['topology']} | {r['chips']} | {mesh_text} | "
        f"{r['batch_size']:,} × {per_seq:,} | {gib(r.get('per_device_peak_estimate_gib'))} | "
        f"{gib(r.get('per_device_peak_xla_gib'))} | {gib(r.get('hbm_gib'))} | {'yes' if r.get('fits') else '**no**'} | "
        f"{r.get('compile_s', '—')} | {'—' if tflop is None else f'{tflop / 1e12:,.0f}'} | "
        f"{'—' if step is None else f'{step:.2f} s'} |"
    )
  return "\n".join(lines) + "\n"


def check_flags() -> str:
  """What is wrong with the flags (one line naming the fix), or ''."""
  if FLAGS.timeout < 1:
    return f"--timeout={FLAGS.timeout}: give the seconds one compile may take, e.g. 900"
  rows = {"maxtext": MAXTEXT_ROWS, "fit": FIT_ROWS}.get(FLAGS.table, ROWS)
  unmatched = [t for t in FLAGS.only if not any(t in r["name"] for r in rows)]
  if unmatched:
    return (
        f"--only={','.join(FLAGS.only)}: {unmatched[0]!r} names no row; rows are "
        f"{', '.join(r['name'] for r in rows)}"
    )
  return ""


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  problem = check_flags()
  if problem:
    raise UserError(problem)
  table = {"maxtext": maxtext_markdown, "fit": fit_markdown}.get(FLAGS.table, markdown)
  ordered = bench_report.compile_table(
      {"maxtext": MAXTEXT_ROWS, "fit": FIT_ROWS}.get(FLAGS.table, ROWS),
      fit_row if FLAGS.table == "fit" else compile_row,
      FLAGS.out,
      FLAGS.only,
      FLAGS.redo,
      table,
      lambda result: (
          f"fits={result.get('fits')} peak={gib(result.get('per_device_peak_estimate_gib'))} "
          f"GiB compile={result.get('compile_s')} s {result.get('error', '')}".rstrip()
      ),
      name=FLAGS.table if FLAGS.table != "presets" else "tpu",
  )
  print(table(ordered))


if __name__ == "__main__":
  cli.run_script(main)
