"""Time to first step of a training run with a cold and a warm persistent compilation cache, as
JSON (and a markdown row).

    python scripts/bench_compile_cache.py [--config experiments/gpt2.py:cpu] [--out cache.json]

Three runs of `python -m transformers_jax.train`, each in a new workdir, each stopped once its
first step is logged: a priming run with the cache off (it writes the token files every run then
shares, so that neither timed run pays for tokenizing), then a cold run with an empty cache
folder and a warm rerun with the folder the cold run filled. Time to first step is from starting
the process to the `step 1:` line (start-up, data, compilation and the step itself).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import bench_report, output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work
flags.DEFINE_string(
    "config", str(ROOT / "experiments/gpt2.py") + ":cpu", "Experiment to start.", flag_values=FLAGS
)
flags.DEFINE_string("out", "", "Also write the JSON here.", flag_values=FLAGS)
flags.DEFINE_integer("timeout_s", 900, "Give up on a run after this long.", flag_values=FLAGS)


def time_to_first_step(workdir, cache: str, data_cache) -> float:
  cmd = [
      sys.executable,
      "-m",
      "transformers_jax.train",
      "--config",
      FLAGS.config,
      "--workdir",
      str(workdir),
      f"--compile_cache_dir={cache}",
      f"--config.data.cache_dir={data_cache}",
      "--config.log_every=1",
      "--config.eval_every=0",
      "--config.checkpoint_every=0",
      "--config.sample.max_new_tokens=0",
  ]
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  start = time.perf_counter()
  proc = subprocess.Popen(
      cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
  )
  try:
    for line in proc.stdout:
      if line.startswith("step 1/"):  # "step 1/STEPS: loss ..."
        return time.perf_counter() - start
      if time.perf_counter() - start > FLAGS.timeout_s:
        break
    raise UserError(
        f"the run never logged its first step: {proc.stderr.read()[-500:] if proc.poll() else ''}"
    )
  finally:
    proc.kill()
    proc.wait()


def main(argv=None) -> None:
  cli.parse_script_flags(FLAGS, argv)
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    data = tmp / "data"
    time_to_first_step(tmp / "prime", "off", data)
    cold = time_to_first_step(tmp / "cold", str(tmp / "cache"), data)
    warm = time_to_first_step(tmp / "warm", str(tmp / "cache"), data)
    entries = sum(1 for _ in (tmp / "cache").iterdir())
  result = {
      "config": bench_report.shown(FLAGS.config),
      "cold_time_to_first_step_s": round(cold, 2),
      "warm_time_to_first_step_s": round(warm, 2),
      "warm_over_cold": round(warm / cold, 3),
      "cache_entries": entries,
  }
  bench_report.print_json(result, FLAGS.out)
  print("\n| config | cold (s) | warm (s) | warm / cold |\n|---|---|---|---|")
  print(f"| {bench_report.shown(FLAGS.config)} | {cold:.1f} | {warm:.1f} | {warm / cold:.2f} |")


if __name__ == "__main__":
  cli.run_script(main)
