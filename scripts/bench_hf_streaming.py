"""Import and export of a large Hugging Face checkpoint, streamed: peak memory and time, as JSON
(and a markdown row).

    python scripts/bench_hf_streaming.py [--preset 3.2-1b] [--shards 2] [--out streaming.json]

Writes a randomly initialised checkpoint of experiments/llama.py's preset (default Llama-3.2-1B:
1,235,814,400 parameters, bfloat16, about 2.5 GB) as LlamaForCausalLM in `--shards` safetensors
shards with their index, then runs, each in a process of its own whose peak resident memory
(ru_maxrss) is read when it ends:
  read    `interop.load_hf(DIR, "bfloat16")` alone: the tensors in memory as parameters
  import  `python -m transformers_jax.convert --from_hf DIR --workdir RUN --dtype bfloat16`
          (read, then the run's orbax checkpoint written)
  export  `python -m transformers_jax.convert --to_hf OUT --workdir RUN`
and checks that every exported tensor equals the original bit for bit (compared one at a time).
Reports each step's wall seconds and peak memory against the checkpoint's size.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FILE, workdir=output_paths.FOLDER)
flags.DEFINE_string("preset", "3.2-1b", "experiments/llama.py preset to write.", flag_values=FLAGS)
flags.DEFINE_integer(
    "shards", 2, "Safetensors shards of the written checkpoint.", flag_values=FLAGS
)
flags.DEFINE_string("out", "", "Also write the JSON here.", flag_values=FLAGS)
flags.DEFINE_string(
    "workdir",
    "",
    "Folder for the checkpoint, the run and the export (default: a temporary one).",
    flag_values=FLAGS,
)


def write_checkpoint(directory: pathlib.Path, preset: str, shards: int) -> dict:
  """Random bfloat16 tensors of the preset, written by the project's own shard writer; returns
  the config and the sizes."""
  import ml_dtypes
  import numpy as np

  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.interop.families import FAMILY_OF, expected_shapes
  from transformers_jax.interop.common import hf_shapes
  from transformers_jax.interop.tensor_files import nbytes_of, write_shards

  config = load_config_module(str(ROOT / "experiments" / "llama.py")).get_config(preset)
  c = ModelConfig.from_dict(config.model).replace(scan_layers=False, param_dtype="bfloat16")
  family = FAMILY_OF["LlamaForCausalLM"]
  expected = expected_shapes(c)
  shapes = {}
  for rule in family.rules(c, "model."):
    for name, shape in zip(rule.hf, hf_shapes(rule, [expected[p] for p in rule.ours])):
      shapes[name] = shape
  total = sum(nbytes_of(s, ml_dtypes.bfloat16) for s in shapes.values())
  rng = np.random.default_rng(0)

  def tensor(name):
    values = rng.standard_normal(shapes[name], dtype=np.float32) * 0.02
    return values.astype(ml_dtypes.bfloat16)

  directory.mkdir(parents=True, exist_ok=True)
  write_shards(
      directory,
      list(shapes),
      lambda n: (shapes[n], ml_dtypes.bfloat16),
      tensor,
      "model.safetensors",
      max_bytes=-(-total // shards),
  )
  hf = dict(family.hf_config(c, "LlamaForCausalLM"), architectures=["LlamaForCausalLM"])
  (directory / "config.json").write_text(json.dumps(dict(hf, model_type="llama", dtype="bfloat16")))
  return {"parameters": sum(int(np.prod(s)) for s in shapes.values()), "bytes": total}


def identical(original: pathlib.Path, exported: pathlib.Path) -> bool:
  from transformers_jax.interop.tensor_files import TensorFiles

  a, b = (TensorFiles(sorted(d.glob("*.safetensors"))) for d in (original, exported))
  if set(a) != set(b):
    return False
  return all(a[n].tobytes() == b[n].tobytes() for n in a)  # one tensor at a time


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  if FLAGS.shards < 1:
    raise UserError(f"--shards={FLAGS.shards}: give at least 1")
  with tempfile.TemporaryDirectory(dir=FLAGS.workdir or None) as tmp:
    tmp = pathlib.Path(tmp)
    start = time.perf_counter()
    sizes = write_checkpoint(tmp / "hf", FLAGS.preset, FLAGS.shards)
    written_s = time.perf_counter() - start
    read = child([sys.executable, "-c", READ, str(tmp / "hf")])
    python = [sys.executable, "-m", "transformers_jax.convert"]
    run_dir = ["--workdir", str(tmp / "run")]
    imported = child(python + ["--from_hf", str(tmp / "hf"), *run_dir, "--dtype", "bfloat16"])
    exported = child(python + ["--to_hf", str(tmp / "out"), *run_dir])
    same = identical(tmp / "hf", tmp / "out")
  gib = 2**30
  result = {
      "preset": f"llama.py:{FLAGS.preset}",
      "parameters": sizes["parameters"],
      "checkpoint_gib": round(sizes["bytes"] / gib, 3),
      "shards": FLAGS.shards,
      "write_s": round(written_s, 1),
      "read": {**read, "peak_over_size": round(read["peak_rss_bytes"] / sizes["bytes"], 3)},
      "import": {
          **imported,
          "peak_over_size": round(imported["peak_rss_bytes"] / sizes["bytes"], 3),
      },
      "export": {
          **exported,
          "peak_over_size": round(exported["peak_rss_bytes"] / sizes["bytes"], 3),
      },
      "exported_bit_identical": same,
  }
  print(json.dumps(result))
  steps = ", ".join(
      f"{k} {result[k]['wall_s']} s, peak {result[k]['peak_over_size']}x"
      for k in ("read", "import", "export")
  )
  print(
      f"| {result['preset']} | {result['checkpoint_gib']} GiB in {FLAGS.shards} shards | "
      f"{steps} | bit-identical: {same} |"
  )
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(json.dumps(result, indent=1) + "\n")
  if not same:
    raise SystemExit(1)


# What measures one step: run the command given as JSON, print its wall seconds and peak
# resident memory (ru_maxrss of a process's children is the largest of them all, so each step
# runs under a parent of its own).
MEASURE = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(json.loads(sys.argv[1]), capture_output=True, text=True)
wall = time.perf_counter() - start
if done.returncode:
  sys.exit(done.stderr.strip().splitlines()[-1])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"wall_s": round(wall, 1), "peak_rss_bytes": peak}))
"""
READ = "import sys; from transformers_jax.interop import load_hf; load_hf(sys.argv[1], 'bfloat16')"


def child(cmd: list[str]) -> dict:
  """Wall seconds and peak resident memory (bytes) of `cmd`, in a process of its own."""
  out = subprocess.run(
      [sys.executable, "-c", MEASURE, json.dumps(cmd)], capture_output=True, text=True, cwd=ROOT
  )
  if out.returncode:
    raise UserError(f"{' '.join(cmd[2:4])} failed: {out.stderr.strip().splitlines()[-1]}")
  return json.loads(out.stdout)


if __name__ == "__main__":
  cli.run_script(main)
