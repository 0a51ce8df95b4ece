"""Deviceless TPU compiles of the train step with int8 matmuls against float: GPT-3 6.7B and
Llama-3.1-8B on 64 chips of v5e and v5p (bf16 compute, float32 parameters and Adam state,
scanned layers, full remat, FSDP over all 64 chips, 64 sequences of 2,048 tokens, the default
attention: splash on TPU), and GPT-2 small on v5e-8. Each row is one
`python -m transformers_jax.train --compile_only ...` (libtpu's compiler, no TPU needed):

    python scripts/quantization_compile_rows.py --out experiments/results/quantization
    python scripts/quantization_compile_rows.py --only "llama v5e"   # rows whose name has it

Writes OUT/compile.json and compile.md (per-chip memory, dots, quantized_dots, XLA's bytes
accessed); rows already in compile.json are kept unless --redo.
"""

from __future__ import annotations

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths
from transformers_jax.scripting.bench_report import compile_only, compile_table

FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_string("out", "experiments/results/quantization", "Output folder.", flag_values=FLAGS)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_multi_string("only", [], "Compile only rows whose name has this.", flag_values=FLAGS)
flags.DEFINE_bool("redo", False, "Compile rows already in compile.json again.", flag_values=FLAGS)
flags.DEFINE_float("timeout", 1200, "Seconds one compile may take.", flag_values=FLAGS)

COMMON = [
    "--config.model.dtype=bfloat16",
    "--config.model.scan_layers=True",
    "--config.model.remat=full",
    "--config.mesh.preset=",
    "--config.mesh.expert=1",
    "--config.mesh.data=1",
    "--config.mesh.tensor=1",
]
# Llama-3.1-8B's 128,256-token head: its logits a quarter at a time (tasks/base.py)
MODELS = {
    "gpt3-6.7b": ["--config=experiments/gpt3.py:6.7b"],
    "llama-3.1-8b": ["--config=experiments/llama.py:3.1-8b", "--config.loss_chunks=4"],
    "gpt2-small": ["--config=experiments/gpt2.py:small"],
}


def row(model, topology, fsdp, batch, seq_len, mode):
  return {
      "name": f"{model} {topology.split(':')[0]} {mode or 'bf16'}",
      "args": [
          *MODELS[model],
          f"--config.mesh.topology={topology}",
          f"--config.mesh.fsdp={fsdp}",
          f"--config.batch_size={batch}",
          f"--config.seq_len={seq_len}",
          f"--config.model.max_len={seq_len}",
          f"--config.model.quantization={mode}",
          *COMMON,
      ],
  }


ROWS = [
    row(m, t, 64, 64, 2048, mode)
    for m in ("gpt3-6.7b", "llama-3.1-8b")
    for t in ("v5e:8x8", "v5p:4x4x4")
    for mode in ("int8", "")
] + [row("gpt2-small", "v5e:2x4", 8, 64, 1024, mode) for mode in ("int8", "")]

FIELDS = (
    ("per_device_peak_xla_gib", "per-chip peak GiB", "{:.2f}"),
    ("hbm_gib", "HBM GiB", "{:.0f}"),
    ("dots", "dots", "{}"),
    ("quantized_dots", "quantized dots", "{}"),
    ("xla_bytes_accessed_per_device_gib", "XLA bytes accessed GiB", "{:.1f}"),
    ("compile_s", "compile s", "{:.0f}"),
)


def markdown(rows) -> str:
  head = "| row | " + " | ".join(f[1] for f in FIELDS) + " |"
  lines = [head, "|---|" + "---:|" * len(FIELDS)]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['name']} | " + r["error"] + " |" * len(FIELDS))
      continue
    cells = [fmt.format(r[k]) if r.get(k) is not None else "—" for k, _, fmt in FIELDS]
    lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  a = FLAGS

  def compile_row(r):
    return {"name": r["name"], **compile_only(r["args"], a.timeout)}

  def summary(r):
    return r.get("error") or f"{r.get('quantized_dots')}/{r.get('dots')} quantized dots"

  rows = compile_table(ROWS, compile_row, a.out, a.only, a.redo, markdown, summary, "compile")
  print(markdown(rows))


if __name__ == "__main__":
  cli.run_script(main)
