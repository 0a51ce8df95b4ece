"""Mixture of experts at scale: compile the Mixtral-shaped preset's train step for TPU v5p-64
(v5p:4x4x4) with each `model.moe_impl` and mesh, and tabulate per-chip memory and XLA's FLOPs.

    python scripts/moe_capacity.py                 # every row, skipping those already written
    python scripts/moe_capacity.py --only=flops --redo   # recompile the FLOP rows

Each row is one `python -m transformers_jax.train --compile_only` run of
experiments/mixtral.py:8x7b (46,702,792,704 parameters): bf16 compute, float32 parameters and
Adam state, full remat, 64 sequences of 4,096 tokens per step (one per chip). Memory rows scan
the 32 layers; FLOP rows compile 2 layers unscanned (XLA's cost analysis counts a loop body
once; a step whose only loops hold no matmul, the ragged layer's bookkeeping over its groups, is
counted in a second process) and compare XLA's FLOPs with the model's (6N + attention, counting the top_k experts), next
to a dense model of the same shape (feed_forward=dense, one expert's width). Writes
experiments/results/moe/tpu.json (what --compile_only printed, per row) and tpu.md. Needs the
`tpu` extra; each memory row takes about 8 minutes and 4 GB of host memory.
"""

from __future__ import annotations

import json
import subprocess
import sys

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import bench_report, output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string(
    "out", "experiments/results/moe", "Folder for tpu.json and tpu.md.", flag_values=FLAGS
)
flags.DEFINE_list(
    "only", [], "Compile only the rows whose name contains one of these texts.", flag_values=FLAGS
)
flags.DEFINE_bool("redo", False, "Recompile rows already in tpu.json.", flag_values=FLAGS)
flags.DEFINE_integer(
    "timeout", 1800, "Seconds one compile may take.", lower_bound=1, flag_values=FLAGS
)
flags.DEFINE_string(
    "count_flops",
    "",
    "Internal: compile this FLOP row in this process, print JSON.",
    flag_values=FLAGS,
)

CONFIG = "experiments/mixtral.py:8x7b"
COMMON = [
    f"--config={CONFIG}",
    "--config.mesh.topology=v5p:4x4x4",
    "--config.batch_size=64",
    "--config.seq_len=4096",
    "--config.model.dtype=bfloat16",
    "--config.model.remat=full",
    "--config.mesh.preset=",
    "--config.mesh.data=1",
]


def row(name, impl, fsdp, expert=1, extra=()):
  return {
      "name": name,
      "impl": impl,
      "args": [
          *COMMON,
          f"--config.mesh.fsdp={fsdp}",
          f"--config.mesh.expert={expert}",
          f"--config.model.moe_impl={impl}",
          *extra,
      ],
  }


UNSCANNED = ["--config.model.num_layers=2", "--config.model.scan_layers=False"]
DENSE_FFN = ["--config.model.feed_forward=dense"]
ROWS = [
    row("memory dense fsdp 64", "dense", 64),
    row("memory ragged fsdp 64", "ragged", 64),
    row("memory dense fsdp 8 x expert 8", "dense", 8, 8),
    row("memory ragged fsdp 8 x expert 8", "ragged", 8, 8),
    row(
        "memory ragged fsdp 8 x expert 8 (capacity 1.25)",
        "ragged",
        8,
        8,
        ["--config.model.moe_dropless=False", "--config.model.capacity_factor=1.25"],
    ),
    row("flops dense-ffn model fsdp 64", "dense", 64, extra=[*UNSCANNED, *DENSE_FFN]),
    row("flops dense fsdp 64", "dense", 64, extra=UNSCANNED),
    row("flops ragged fsdp 64", "ragged", 64, extra=UNSCANNED),
    row("flops ragged fsdp 8 x expert 8", "ragged", 8, 8, extra=UNSCANNED),
]


def loop_free_flops(r) -> dict:
  """XLA's FLOPs of a FLOP row's compiled step even where it has loops, when no loop body holds
  a matmul, a convolution or a kernel call (the ragged layer's bookkeeping over its groups):
  counting such bodies once leaves out integer work only. The one exception is the ragged
  layer's scan over its experts (modules/moe_weights.py, FSDP on TPU): each step's grouped
  matmuls are estimated at all M rows but compute only that expert's rows, so counting the body
  once counts each row once, the layer's matmul FLOPs; what it leaves out is the step's
  elementwise work on [M, width] arrays E - 1 times (about 0.1% of the matmuls')."""
  import re

  from transformers_jax.machine import hardware
  from transformers_jax.config import load_config_module
  from transformers_jax.modules import moe_weights
  from transformers_jax.train import compile as compile_step

  file, preset = CONFIG.split(":")
  config = load_config_module(file).get_config(preset)
  for arg in r["args"][1:]:
    key, value = arg.removeprefix("--config.").split("=", 1)
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    old = node[leaf]
    node[leaf] = type(old)(value == "True" if isinstance(old, bool) else value)
  devices = hardware.topology_devices(config.mesh.topology)
  compiled, _, _ = compile_step.compile_train_step(config, devices)
  text = compiled.as_text()
  loops = re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)([^\n]*)", text)
  bodies = {body for body, _ in loops}
  streams = {body for body, rest in loops if moe_weights.STREAM_SCOPE in rest}
  heavy = []
  for body in bodies - streams:
    found = re.search(r"\n%?" + re.escape(body) + r" [^\n]*\{\n(.*?)\n\}", text, re.S)
    if found is None or re.search(r"\b(dot|convolution|custom-call)\(", found.group(1)):
      heavy.append(body)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {
      "loops": len(bodies),
      "expert_stream_loops": len(streams),
      "loops_with_matmuls": len(heavy),
      "xla_flops_per_device_per_step": None if heavy else float(cost.get("flops", 0.0)),
  }


def compile_row(r) -> dict:
  result = bench_report.compile_only(r["args"], FLAGS.timeout)
  if "exit_code" not in result:  # timed out
    return {"name": r["name"], **result}
  out = {"name": r["name"], "moe_impl": r["impl"], **result}
  if "error" not in out:
    if "xla_flops_omitted" in out and r["name"].startswith("flops"):
      counted = subprocess.run(
          [sys.executable, __file__, f"--count_flops={r['name']}"],
          capture_output=True,
          text=True,
          timeout=FLAGS.timeout,
      )
      if counted.returncode == 0:
        out.update(json.loads(counted.stdout.strip().splitlines()[-1]))
    flops = out.get("xla_flops_per_device_per_step")
    if flops:
      out["xla_flops_per_model_flop"] = flops / out["model_flops_per_device_per_step"]
  return out


def fmt(x, digits=1) -> str:
  return "—" if x is None else f"{x:.{digits}f}"


def markdown(results: list[dict]) -> str:
  lines = [
      "| row | per-chip peak GiB | XLA peak GiB | temporaries GiB | XLA FLOPs / model FLOP | "
      "compile s |",
      "|---|---:|---:|---:|---:|---:|",
  ]
  for r in results:
    if "error" in r and "chips" not in r:
      lines.append(f"| {r['name']} | error: {r['error']} | | | | |")
      continue
    lines.append(
        f"| {r['name']} | {fmt(r.get('per_device_peak_estimate_gib'))} | "
        f"{fmt(r.get('per_device_peak_xla_gib'))} | {fmt(r.get('per_device_temp_gib'))} | "
        f"{fmt(r.get('xla_flops_per_model_flop'), 3)} | {r.get('compile_s', '—')} |"
    )
  return "\n".join(lines) + "\n"


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  if FLAGS.count_flops:
    wanted = [r for r in ROWS if r["name"] == FLAGS.count_flops]
    if not wanted:
      raise UserError(f"--count_flops={FLAGS.count_flops!r} names no row")
    print(json.dumps(loop_free_flops(wanted[0])))
    return
  unmatched = [t for t in FLAGS.only if not any(t in r["name"] for r in ROWS)]
  if unmatched:
    raise UserError(
        f"--only={','.join(FLAGS.only)}: {unmatched[0]!r} names no row; rows are "
        f"{', '.join(r['name'] for r in ROWS)}"
    )
  ordered = bench_report.compile_table(
      ROWS,
      compile_row,
      FLAGS.out,
      FLAGS.only,
      FLAGS.redo,
      markdown,
      lambda result: (
          f"peak={fmt(result.get('per_device_peak_estimate_gib'))} GiB "
          f"flops ratio={fmt(result.get('xla_flops_per_model_flop'), 3)} "
          f"compile={result.get('compile_s')} s {result.get('error', '')}".rstrip()
      ),
  )
  print(markdown(ordered))


if __name__ == "__main__":
  cli.run_script(main)
