"""Input-pipeline figures on this machine, as JSON (stdout) and a markdown table (stderr).

    python scripts/bench_data.py [--big_mb=2048] [--small_mb=200] [--tokenize_mb=64]
        [--bpe_mb=16] [--out=experiments/results/data/bench_data.json]

1. Tokenization rate (MB of text per second) into the token cache, byte and BPE tokenizers,
   with 1 and 2 worker processes (a fresh cache each time; BPE training not counted).
2. The grain pipeline's batch rate (batch 16 x 256 random windows, 0 and 2 workers) against the
   rate the reference CPU train step consumes batches (d_model 256, 4 layers, batch 16 x 256,
   timed by scripts/bench_train.py).
3. Peak resident memory (VmHWM) of a training process (3 steps of the reference model, cache
   built in the run with 2 tokenize workers, 2 batch workers) on the bundled corpus and on
   generated corpora of `small_mb` and `big_mb` MB, and of the pipeline alone (cache built, 200
   batches read) on the same corpora. Worker processes are not counted.

Corpora are generated under the system temporary folder and deleted afterwards. The host's
cores may be shared: rates are what this run saw.
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
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work
flags.DEFINE_integer("big_mb", 2048, "Size of the large generated corpus (MB).", flag_values=FLAGS)
flags.DEFINE_integer("small_mb", 200, "Size of the small generated corpus (MB).", flag_values=FLAGS)
flags.DEFINE_integer(
    "tokenize_mb", 64, "Text tokenized for the byte rates (MB).", flag_values=FLAGS
)
flags.DEFINE_integer("bpe_mb", 16, "Text tokenized for the BPE rates (MB).", flag_values=FLAGS)
flags.DEFINE_string(
    "out", "", "Also write the JSON here (and the table beside it, .md).", flag_values=FLAGS
)

REFERENCE = dict(d_model=256, num_layers=4, num_heads=4, max_len=256, vocab_size=256)
BATCH, SEQ = 16, 256


def generate(path: pathlib.Path, megabytes: int, seed: int = 0) -> int:
  """A text file of `megabytes` MB: lines of random words drawn from a Zipf-like vocabulary."""
  rng = np.random.default_rng(seed)
  letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
  vocab = ["".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(5000)]
  weights = 1.0 / np.arange(1, len(vocab) + 1)
  weights /= weights.sum()
  blocks = []
  for _ in range(4):  # 4 distinct 8 MB blocks, written in turn
    words = rng.choice(len(vocab), 1_600_000, p=weights)
    lines = [" ".join(vocab[w] for w in words[i : i + 12]) for i in range(0, len(words), 12)]
    blocks.append(("\n".join(lines) + "\n").encode())
  target, written = megabytes << 20, 0
  with open(path, "wb") as f:
    i = 0
    while written < target:
      chunk = blocks[i % len(blocks)][: target - written]
      f.write(chunk)
      written += len(chunk)
      i += 1
  return written


def tokenization_rates(tmp: pathlib.Path, tokenize_mb: int, bpe_mb: int) -> list[dict]:
  from transformers_jax.data import make_tokenizer, sources
  from transformers_jax.data.token_cache import build_cache

  rows = []
  for kind, mb in (("byte", tokenize_mb), ("bpe", bpe_mb)):
    corpus = tmp / f"tok-{kind}.txt"
    size = generate(corpus, mb, seed=1)
    texts = sources.sample_texts([corpus], "text", 4 << 20) if kind == "bpe" else None
    tok = make_tokenizer(kind, 4096 if kind == "bpe" else 256, texts=texts)
    for workers in (1, 2):
      root = tmp / f"cache-{kind}-{workers}"
      t = time.perf_counter()
      cache = build_cache(corpus, tok, root, tok.vocab_size, workers=workers, progress=False)
      seconds = time.perf_counter() - t
      rows.append(
          {
              "tokenizer": kind,
              "workers": workers,
              "mb": round(size / 2**20, 1),
              "tokens": cache.num_tokens,
              "seconds": round(seconds, 2),
              "mb_per_s": round(size / 2**20 / seconds, 2),
          }
      )
      print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
      shutil.rmtree(root)
    corpus.unlink()
  return rows


def reference_step() -> dict:
  cmd = [
      sys.executable,
      str(ROOT / "scripts/bench_train.py"),
      "--config",
      str(ROOT / "experiments/gpt2.py") + ":tiny",
      "--steps",
      "10",
      f"--config.batch_size={BATCH}",
      f"--config.seq_len={SEQ}",
      *(f"--config.model.{k}={v}" for k, v in REFERENCE.items()),
  ]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  return {"step_s": result["step_s"], "batches_per_s": 1.0 / result["step_s"]}


def pipeline_rates(tmp: pathlib.Path, corpus: pathlib.Path, batches: int = 300) -> list[dict]:
  from transformers_jax.data import ByteTokenizer
  from transformers_jax.data import pipeline as P
  from transformers_jax.data.token_cache import build_cache
  from transformers_jax.tasks.lm import NextTokenRows

  tok = ByteTokenizer()
  cache = build_cache(corpus, tok, tmp / "pipeline-cache", 256, workers=2, progress=False)
  train, _ = P.split_spans(cache)
  fn = P.StepBatches(P.TokenSpans(cache, train), NextTokenRows(), BATCH, SEQ, seed=0)
  rows = []
  for workers in (0, 2):
    stream = P.batch_stream(fn, 0, batches + 10, workers=workers, prefetch=8)
    for _ in range(10):  # workers started, buffers filled
      next(stream)
    t = time.perf_counter()
    for _ in range(batches):
      next(stream)
    seconds = time.perf_counter() - t
    stream.close()
    rows.append({"workers": workers, "batches": batches, "batches_per_s": batches / seconds})
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  return rows


PEAK = r"""
def peak_rss_mb():
  # VmHWM: this process's own peak resident set (ru_maxrss would also count what the parent
  # held when it forked this process, as Linux keeps it across exec)
  for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) / 1024
"""

CHILD = PEAK + r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
from transformers_jax.config import load_config_module
from transformers_jax.train.entry import train
config = load_config_module(sys.argv[3] + "/experiments/gpt2.py").get_config("tiny")
for key, value in json.loads(sys.argv[4]).items():
  config.model[key] = value
config.data.path, config.data.tokenize_workers, config.data.workers = sys.argv[1], 2, 2
if not sys.argv[1]:  # the bundled corpus: the same training process without the pipeline
  config.data.workers = 0
config.batch_size, config.seq_len, config.steps, config.eval_batches = 16, 256, 3, 2
config.log_every, config.sample.max_new_tokens = 1, 0
t = time.perf_counter()
result = train(config, sys.argv[2])
print(json.dumps({
    "seconds": time.perf_counter() - t,
    "peak_rss_mb": peak_rss_mb(),
    "loss": result["loss"],
}))
"""


PIPELINE_CHILD = PEAK + r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
from transformers_jax.config import ModelConfig, load_config_module
from transformers_jax.tasks.lm import NextTokenRows
from transformers_jax.tasks.stream_data import streamed_text_data
config = load_config_module(sys.argv[3] + "/experiments/gpt2.py").get_config("tiny")
config.data.path, config.data.tokenize_workers, config.data.workers = sys.argv[1], 2, 2
config.batch_size, config.seq_len, config.eval_batches = 16, 256, 2
t = time.perf_counter()
data = streamed_text_data(config, ModelConfig.from_dict(config.model), sys.argv[2], lambda tok: NextTokenRows(), False)
stream = data.train_stream(0, 200)
for batch in stream:
  pass
stream.close()
print(json.dumps({
    "seconds": time.perf_counter() - t,
    "peak_rss_mb": peak_rss_mb(),
}))
"""


def peak_rss(tmp: pathlib.Path, corpus: pathlib.Path | None, child: str = CHILD) -> dict:
  """Peak RSS of a training process (`child` = CHILD) or of the pipeline alone (PIPELINE_CHILD)
  on `corpus` (None: the bundled corpus); the token cache is built inside the process."""
  workdir = tmp / f"run-{corpus.stem if corpus else 'bundled'}"
  out = subprocess.run(
      [
          sys.executable,
          "-c",
          child,
          str(corpus or ""),
          str(workdir),
          str(ROOT),
          json.dumps(REFERENCE),
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
  )
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  result = json.loads(out.stdout.strip().splitlines()[-1])
  result["corpus_mb"] = round(corpus.stat().st_size / 2**20) if corpus else "bundled (4)"
  result["process"] = "train" if child == CHILD else "pipeline only"
  result.setdefault("loss", None)
  print(json.dumps(result), file=sys.stderr, flush=True)
  shutil.rmtree(workdir)
  return result


def markdown(report: dict) -> str:
  lines = ["| tokenizer | workers | MB | s | MB/s |", "|---|---|---|---|---|"]
  for r in report["tokenization"]:
    lines.append(
        f"| {r['tokenizer']} | {r['workers']} | {r['mb']} | {r['seconds']} | {r['mb_per_s']} |"
    )
  ref = report["reference_step"]
  lines += [
      "",
      f"Reference CPU step (d_model 256, 4 layers, {BATCH} x {SEQ}): {ref['step_s']:.3f} s "
      f"= {ref['batches_per_s']:.2f} batches/s",
      "",
      "| pipeline workers | batches/s | x reference step |",
      "|---|---|---|",
  ]
  for r in report["pipeline"]:
    lines.append(
        f"| {r['workers']} | {r['batches_per_s']:.1f} | "
        f"{r['batches_per_s'] / ref['batches_per_s']:.0f}x |"
    )
  lines += ["", "| process | corpus MB | peak RSS MB (VmHWM) | run s |"]
  lines.append("|---|---|---|---|")
  for r in report["rss"]:
    lines.append(
        f"| {r['process']} | {r['corpus_mb']} | {r['peak_rss_mb']:.0f} | {r['seconds']:.0f} |"
    )
  return "\n".join(lines)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  for name in ("big_mb", "small_mb", "tokenize_mb", "bpe_mb"):
    if FLAGS[name].value < 1:
      raise UserError(f"--{name}={FLAGS[name].value}: give a positive size in MB")
  args = FLAGS
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_data-"))
  try:
    report = {"cpus": os.cpu_count()}
    report["tokenization"] = tokenization_rates(tmp, args.tokenize_mb, args.bpe_mb)
    report["reference_step"] = reference_step()
    small = tmp / "small.txt"
    generate(small, args.small_mb, seed=2)
    report["pipeline"] = pipeline_rates(tmp, small)
    report["rss"] = [peak_rss(tmp, None), peak_rss(tmp, small)]
    report["rss"].append(peak_rss(tmp, small, PIPELINE_CHILD))
    small.unlink()
    big = tmp / "big.txt"
    generate(big, args.big_mb, seed=3)
    report["rss"].append(peak_rss(tmp, big))
    report["rss"].append(peak_rss(tmp, big, PIPELINE_CHILD))
    big.unlink()
    small_rss, big_rss = (r["peak_rss_mb"] for r in report["rss"][1::2])
    ratio = (
        max(r["batches_per_s"] for r in report["pipeline"])
        / report["reference_step"]["batches_per_s"]
    )
    report["goals"] = {
        "pipeline_over_step": ratio,
        "pipeline_at_least_20x": ratio >= 20,
        "big_rss_at_most_1gb": big_rss <= 1024,
        "big_rss_within_10pct_of_small": big_rss <= 1.1 * small_rss,
        "train_rss_over_bundled_corpus_mb": big_rss - report["rss"][0]["peak_rss_mb"],
    }
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  bench_report.print_report(report, markdown(report), args.out)


if __name__ == "__main__":
  cli.run_script(main)
