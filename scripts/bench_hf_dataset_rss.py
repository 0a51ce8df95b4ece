"""Peak resident memory of training on a Hugging Face dataset folder, small against large, as
JSON (stdout) and a markdown table (stderr).

    python scripts/bench_hf_dataset_rss.py [--small_mb=200] [--big_mb=2048] [--steps=3]
        [--out=experiments/results/data/hf_dataset_rss.json]

Builds two `datasets.Dataset`s of synthetic text (documents of about 2 KB of Zipf-distributed
words) of `small_mb` and `big_mb` MB in the system temporary folder and writes each with
`save_to_disk` (shards of 500 MB), then trains the tiny GPT-2 (experiments/gpt2.py:tiny, batch
16 x 128) for `steps` steps with `--config.data.path` set to each folder, in a fresh
subprocess each: the folder tokenized into the token cache inside that process
(data.tokenize_workers=1) and batches made by threads of it (data.workers=0), so that every
byte the run reads passes through the process measured. Reports its peak resident set
(VmHWM), the run's time and the ratio of the two peaks (goal: the large set within 10 % of the
small). The datasets and runs are deleted afterwards.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import bench_report, output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent

FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_integer("small_mb", 200, "Size of the small dataset's text (MB).", flag_values=FLAGS)
flags.DEFINE_integer("big_mb", 2048, "Size of the large dataset's text (MB).", flag_values=FLAGS)
flags.DEFINE_integer("steps", 3, "Training steps over each dataset.", flag_values=FLAGS)
flags.DEFINE_string(
    "out", "", "Also write the JSON here (and the table beside it, .md).", flag_values=FLAGS
)
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work

DOCUMENT_BYTES = 2048


def documents(megabytes: int, seed: int = 0):
  """{"text": ...} rows of about DOCUMENT_BYTES each, `megabytes` MB of them in all: words of a
  Zipf-like vocabulary of 5,000, from 4 distinct blocks of 8 MB used in turn."""
  rng = np.random.default_rng(seed)
  letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
  vocab = np.array(["".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(5000)])
  weights = 1.0 / np.arange(1, len(vocab) + 1)
  weights /= weights.sum()
  blocks = []
  for _ in range(4):
    words = vocab[rng.choice(len(vocab), 1_600_000, p=weights)]
    text = " ".join(words)
    blocks.append([text[i : i + DOCUMENT_BYTES] for i in range(0, len(text), DOCUMENT_BYTES)])
  target, written, i = megabytes << 20, 0, 0
  while written < target:
    for doc in blocks[i % len(blocks)]:
      yield {"text": doc}
      written += len(doc)
      if written >= target:
        return
    i += 1


def build(folder: pathlib.Path, megabytes: int, seed: int) -> dict:
  """A save_to_disk folder of `megabytes` MB of text; its rows, files and size on disk."""
  import datasets

  datasets.disable_progress_bars()
  t = time.perf_counter()
  cache = folder.with_name(folder.name + "-cache")
  dataset = datasets.Dataset.from_generator(
      documents, gen_kwargs={"megabytes": megabytes, "seed": seed}, cache_dir=str(cache)
  )
  dataset.save_to_disk(str(folder))
  rows = len(dataset)
  del dataset
  shutil.rmtree(cache)
  files = sorted(folder.glob("*.arrow"))
  return {
      "text_mb": megabytes,
      "rows": rows,
      "arrow_files": len(files),
      "disk_mb": round(sum(f.stat().st_size for f in files) / 2**20),
      "build_s": round(time.perf_counter() - t, 1),
  }


CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
from transformers_jax.config import load_config_module
from transformers_jax.train.entry import train

def peak_rss_mb():
  # VmHWM: this process's own peak resident set (ru_maxrss would also count what the parent
  # held when it forked this process, as Linux keeps it across exec)
  for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) / 1024

config = load_config_module(sys.argv[3] + "/experiments/gpt2.py").get_config("tiny")
config.data.path, config.data.tokenize_workers, config.data.workers = sys.argv[1], 1, 0
config.batch_size, config.seq_len, config.steps, config.eval_batches = 16, 128, int(sys.argv[4]), 2
config.log_every, config.eval_every, config.checkpoint_every = 1, 0, 0
config.sample.max_new_tokens = 0
t = time.perf_counter()
result = train(config, sys.argv[2])
print(json.dumps({
    "run_s": round(time.perf_counter() - t, 1),
    "peak_rss_mb": round(peak_rss_mb(), 1),
    "loss": result["loss"],
}))
"""


def peak_rss(folder: pathlib.Path, workdir: pathlib.Path, steps: int) -> dict:
  out = subprocess.run(
      [sys.executable, "-c", CHILD, str(folder), str(workdir), str(ROOT), str(steps)],
      capture_output=True,
      text=True,
      cwd=ROOT,
  )
  if out.returncode:
    raise UserError(f"the training process failed: {out.stderr.strip().splitlines()[-1]}")
  shutil.rmtree(workdir)
  return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(report: dict) -> str:
  lines = [
      "| dataset | text MB | rows | .arrow files | peak RSS MB (VmHWM) | run s |",
      "|---|---|---|---|---|---|",
  ]
  for name in ("small", "big"):
    r = report[name]
    lines.append(
        f"| {name} | {r['text_mb']} | {r['rows']:,} | {r['arrow_files']} | "
        f"{r['peak_rss_mb']:.0f} | {r['run_s']:.0f} |"
    )
  goal = report["goals"]
  lines += [
      "",
      f"Large over small peak RSS: {goal['big_over_small']:.3f} (goal: at most 1.10, "
      f"{'met' if goal['within_10pct'] else 'not met'}).",
  ]
  return "\n".join(lines)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  for name in ("small_mb", "big_mb", "steps"):
    if FLAGS[name].value < 1:
      raise UserError(f"--{name}={FLAGS[name].value}: give a positive number")
  args = FLAGS
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_hf_rss-"))
  report = {"cpus": os.cpu_count(), "steps": args.steps}
  try:
    for name, megabytes, seed in (("small", args.small_mb, 1), ("big", args.big_mb, 2)):
      folder = tmp / name
      report[name] = build(folder, megabytes, seed)
      report[name].update(peak_rss(folder, tmp / f"run-{name}", args.steps))
      print(json.dumps({name: report[name]}), file=sys.stderr, flush=True)
      shutil.rmtree(folder)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  ratio = report["big"]["peak_rss_mb"] / report["small"]["peak_rss_mb"]
  report["goals"] = {"big_over_small": round(ratio, 4), "within_10pct": ratio <= 1.10}
  bench_report.print_report(report, markdown(report), args.out)


if __name__ == "__main__":
  cli.run_script(main)
