"""MFU accounting across processes: the same training run on the same simulated devices, as one
process and as two, as JSON (and markdown).

    python scripts/bench_mfu_processes.py [--devices 4] [--steps 30] [--device_peak_flops 0]

One process drives `--devices` CPU devices; then two processes drive half each (localhost
cluster, gloo collectives), with the same mesh (fsdp over all of them) and the same global batch.
Both runs log tokens/s over the global batch and MFU against the peak of every device of the run,
so their MFUs must relate as their tokens/s do: `mfu_ratio / tokens_ratio` is 1 when the
accounting is right (it was the process count when the peak counted one process's devices).
Both runs are given the same per-device peak (`--device_peak_flops`, by default this CPU's
measured matmul rate over the devices, measured once here): each run measuring its own would
add the noise of a shared host's measurement to a comparison of accounting.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.machine import local_cluster
from transformers_jax.scripting import bench_report, output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work
flags.DEFINE_string(
    "config", str(ROOT / "experiments/gpt2.py") + ":tiny", "Experiment to run.", flag_values=FLAGS
)
flags.DEFINE_integer("devices", 4, "Simulated CPU devices in all (even).", flag_values=FLAGS)
flags.DEFINE_integer(
    "steps", 30, "Training steps per run (throughput from the last half).", flag_values=FLAGS
)
flags.DEFINE_float(
    "device_peak_flops",
    0.0,
    "Peak FLOP/s of one device (0: this CPU's measured rate over --devices).",
    flag_values=FLAGS,
)
flags.DEFINE_string("out", "", "Also write the JSON here.", flag_values=FLAGS)


def command(workdir, peak, *extra):
  return [
      sys.executable,
      "-m",
      "transformers_jax.train",
      "--config",
      FLAGS.config,
      "--workdir",
      str(workdir),
      f"--config.steps={FLAGS.steps}",
      f"--config.log_every={FLAGS.steps // 2}",
      "--config.eval_every=0",
      "--config.checkpoint_every=0",
      "--config.sample.max_new_tokens=0",
      "--config.mesh.data=1",
      "--config.mesh.fsdp=-1",
      f"--config.device_peak_flops={peak}",
      "--compile_cache_dir=off",
      *extra,
  ]


def env(devices: int) -> dict:
  e = dict(os.environ, JAX_PLATFORMS="cpu")
  e["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  return e


def last_logged(workdir) -> dict:
  rows = [
      json.loads(x)
      for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text().split("\n")
      if x.strip()
  ]
  return [r for r in rows if "tokens_per_s" in r][-1]


def main(argv=None) -> None:
  cli.parse_script_flags(FLAGS, argv)
  if FLAGS.devices < 2 or FLAGS.devices % 2:
    raise UserError(f"--devices={FLAGS.devices}: give an even number, at least 2")
  peak = FLAGS.device_peak_flops
  if not peak:
    from transformers_jax.train import metrics

    peak = metrics.measured_cpu_peak() / FLAGS.devices
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    one = subprocess.run(
        command(tmp / "one", peak), capture_output=True, text=True, cwd=ROOT, env=env(FLAGS.devices)
    )
    if one.returncode:
      raise UserError(f"the one-process run failed: {one.stderr.strip()[-500:]}")
    procs = local_cluster.start_processes(
        lambda i, address: command(tmp / "two", peak, *local_cluster.cluster_flags(i, address, 2)),
        2,
        env=env(FLAGS.devices // 2),
        cwd=ROOT,
    )
    outs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
      raise UserError(f"the two-process run failed: {outs[0][1].strip()[-500:]}")
    a, b = last_logged(tmp / "one"), last_logged(tmp / "two")
  tokens_ratio = b["tokens_per_s"] / a["tokens_per_s"]
  mfu_ratio = b["mfu"] / a["mfu"]
  result = {
      "config": bench_report.shown(FLAGS.config),
      "devices": FLAGS.devices,
      "one_process": {"tokens_per_s": a["tokens_per_s"], "mfu": a["mfu"]},
      "two_processes": {"tokens_per_s": b["tokens_per_s"], "mfu": b["mfu"]},
      "tokens_ratio": round(tokens_ratio, 4),
      "mfu_ratio": round(mfu_ratio, 4),
      "mfu_ratio_over_tokens_ratio": round(mfu_ratio / tokens_ratio, 4),
      "device_peak_flops": peak,
      "peak_source": "given" if FLAGS.device_peak_flops else "measured once on this CPU",
  }
  bench_report.print_json(result, FLAGS.out)
  print("\n| processes | tokens/s | MFU |\n|---|---|---|")
  print(f"| 1 | {a['tokens_per_s']:,.0f} | {a['mfu']:.2%} |")
  print(f"| 2 | {b['tokens_per_s']:,.0f} | {b['mfu']:.2%} |")
  print(f"\nMFU ratio / tokens ratio: {mfu_ratio / tokens_ratio:.3f} (1 = consistent)")


if __name__ == "__main__":
  cli.run_script(main)
