"""A 3-source data mixture, measured: the tokens each source delivers against its weight, and a
training run killed with SIGKILL and resumed against one never interrupted; JSON (stdout) and
markdown (stderr).

    python scripts/mixture_report.py [--steps=1000] [--batch_size=16] [--seq_len=128]
        [--train_steps=1000] [--out=experiments/results/data/mixture.json]

Three sources are generated in the system temporary folder, told apart by their characters:
`web.jsonl` (lowercase words), `books.txt` (uppercase words) and `numbers`, a Hugging Face
dataset folder written by save_to_disk (digits). With weights 0.5 / 0.3 / 0.2:

1. Proportions: the data pipeline alone (no training) makes `steps` batches of `batch_size`
   rows of `seq_len` tokens, unpacked (random windows) and packed (whole documents); each row's
   source is read off its characters, and the real tokens (packed: padding left out) each source
   delivered are compared with its weight, and with the `tokens_seen/<source>` metric.
2. Resume after kill -9: the tiny GPT-2 trains `train_steps` steps on the mixture (a checkpoint
   every quarter of them) in a subprocess that is killed with SIGKILL once it has passed its
   second checkpoint, then run again to the end; its metrics from the step it resumed at are
   compared with those of a run never interrupted, bit for bit (losses, tokens seen per source,
   held-out loss per source).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
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
flags.DEFINE_integer("steps", 1000, "Batches the proportions are measured over.", flag_values=FLAGS)
flags.DEFINE_integer("batch_size", 16, "Rows per batch.", flag_values=FLAGS)
flags.DEFINE_integer("seq_len", 128, "Tokens per row.", flag_values=FLAGS)
flags.DEFINE_integer("train_steps", 1000, "Steps of the resumed training run.", flag_values=FLAGS)
flags.DEFINE_string(
    "out", "", "Also write the JSON here (and the table beside it, .md).", flag_values=FLAGS
)
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work

WEIGHTS = {"web": 0.5, "books": 0.3, "numbers": 0.2}
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly numbers".split()
# characters that tell each source's rows apart: lowercase, uppercase, digits
CHARACTERS = {"web": (97, 122), "books": (65, 90), "numbers": (48, 57)}


def make_sources(root: pathlib.Path, documents: int = 4000) -> str:
  """The three sources under `root`; the data.mixture string naming them."""
  import datasets

  rng = np.random.default_rng(0)
  docs = [" ".join(rng.choice(WORDS, rng.integers(5, 120))) for _ in range(documents)]
  (root / "web.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  (root / "books.txt").write_text("\n".join(d.upper() for d in docs))
  numbers = [" ".join(map(str, rng.integers(0, 10**6, rng.integers(5, 80)))) for _ in docs]
  datasets.disable_progress_bars()
  datasets.Dataset.from_dict({"text": numbers}).save_to_disk(str(root / "numbers"))
  paths = {"web": "web.jsonl", "books": "books.txt", "numbers": "numbers"}
  return ",".join(f"{root / paths[name]}:{w}" for name, w in WEIGHTS.items())


def source_of_row(tokens: np.ndarray) -> int:
  counts = [np.sum((tokens >= a) & (tokens <= b)) for a, b in CHARACTERS.values()]
  return int(np.argmax(counts))


def proportions(mixture: str, workdir: pathlib.Path, steps: int, batch: int, seq: int) -> list:
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.tasks.lm import NextTokenRows
  from transformers_jax.tasks.stream_data import streamed_text_data

  rows = []
  for packing in (False, True):
    config = load_config_module(str(ROOT / "experiments/gpt2.py")).get_config("tiny")
    config.data.mixture, config.data.packing = mixture, packing
    config.data.tokenize_workers, config.data.cache_dir = 1, str(workdir / "cache")
    config.batch_size, config.seq_len, config.eval_batches = batch, seq, 1
    config.model.max_len = max(config.model.max_len, seq)
    model_cfg = ModelConfig.from_dict(config.model)
    data = streamed_text_data(config, model_cfg, workdir, lambda tok: NextTokenRows(), False)
    t = time.perf_counter()
    real = np.zeros(len(WEIGHTS))
    for step in range(steps):
      got = data.train_batch(step)
      for i, row in enumerate(got["tokens"]):
        real[source_of_row(row)] += got["segment_ids"][i].astype(bool).sum() if packing else seq
    seconds = time.perf_counter() - t
    seen = data.step_metrics(steps)
    share = real / real.sum()
    target = np.asarray(list(WEIGHTS.values()))
    rows.append(
        {
            "packing": packing,
            "steps": steps,
            "rows": steps * batch,
            "real_tokens": {n: int(v) for n, v in zip(WEIGHTS, real)},
            "share": {n: round(float(v), 5) for n, v in zip(WEIGHTS, share)},
            "largest_relative_error": round(float(np.max(np.abs(share / target - 1))), 5),
            "tokens_seen_metric": seen,
            "batches_per_s": round(steps / seconds, 1),
        }
    )
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  return rows


def train_command(mixture: str, workdir: pathlib.Path, steps: int, cache: pathlib.Path) -> list:
  every = max(steps // 4, 1)
  return [
      sys.executable,
      "-m",
      "transformers_jax.train",
      "--config",
      str(ROOT / "experiments/gpt2.py") + ":tiny",
      "--workdir",
      str(workdir),
      f"--config.data.mixture={mixture}",
      f"--config.data.cache_dir={cache}",
      "--config.data.tokenize_workers=1",
      f"--config.steps={steps}",
      "--config.batch_size=8",
      "--config.seq_len=64",
      "--config.log_every=10",
      f"--config.eval_every={every}",
      f"--config.checkpoint_every={every}",
      "--config.eval_batches=2",
      "--config.sample.max_new_tokens=0",
  ]


def logged(workdir: pathlib.Path) -> dict[int, dict]:
  """The last metrics of each step in metrics.jsonl (a resumed run logs again the steps after
  its checkpoint), training and evaluation lines merged."""
  out: dict[int, dict] = {}
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(x) for x in lines if x.strip()]
  for row in rows:  # later lines replace earlier ones key by key
    out.setdefault(row["step"], {}).update(row)
  return out


def last_step(workdir: pathlib.Path) -> int:
  try:
    text = (workdir / "metrics.jsonl").read_text()
  except OSError:
    return 0
  steps = [json.loads(x)["step"] for x in text.splitlines() if x.endswith("}")]
  return max(steps, default=0)


def kill_and_resume(mixture: str, tmp: pathlib.Path, steps: int) -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  cache = tmp / "cache"
  whole, killed = tmp / "whole", tmp / "killed"
  t = time.perf_counter()
  done = subprocess.run(
      train_command(mixture, whole, steps, cache), cwd=ROOT, env=env, capture_output=True, text=True
  )
  if done.returncode:
    raise UserError(f"the uninterrupted run failed: {done.stderr.strip().splitlines()[-1]}")
  whole_s = time.perf_counter() - t
  every = max(steps // 4, 1)
  first = subprocess.Popen(
      train_command(mixture, killed, steps, cache),
      cwd=ROOT,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  # past the second checkpoint's step (its save committed: the folder has its final name)
  while first.poll() is None and not (
      last_step(killed) > 2 * every + 10 and (killed / "checkpoints" / str(2 * every)).is_dir()
  ):
    time.sleep(0.02)
  if first.poll() is not None:
    raise UserError("the run ended before it could be killed: raise --train_steps")
  at = last_step(killed)
  first.send_signal(signal.SIGKILL)
  first.wait()
  again = subprocess.run(
      train_command(mixture, killed, steps, cache),
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
  )
  if again.returncode:
    raise UserError(f"the resumed run failed: {again.stderr.strip().splitlines()[-1]}")
  said = [x for x in again.stdout.splitlines() if "resumed from step" in x]
  resumed_at = int(said[0].split("resumed from step ")[1].split(";")[0]) if said else 0
  a, b = logged(whole), logged(killed)
  compared = [s for s in a if s > resumed_at]
  differ = [s for s in compared if a[s] != b.get(s, {})]
  timing = ("tokens_per_s", "mfu")  # wall-clock figures, not results
  differ = [
      s
      for s in differ
      if {k: v for k, v in a[s].items() if k not in timing}
      != {k: v for k, v in b[s].items() if k not in timing}
  ]
  final = a[steps]
  return {
      "train_steps": steps,
      "killed_after_logging_step": at,
      "resumed_at": resumed_at,
      "steps_compared": len(compared),
      "steps_differing": differ,
      "bit_exact": not differ,
      "final_loss": final["loss"],
      "final_eval_loss": final["eval_loss"],
      "final_eval_loss_by_source": {n: final[f"eval_loss/{n}"] for n in WEIGHTS},
      "final_tokens_seen": {n: final[f"tokens_seen/{n}"] for n in WEIGHTS},
      "uninterrupted_run_s": round(whole_s, 1),
  }


def markdown(report: dict) -> str:
  lines = [
      "Weights: " + ", ".join(f"{n} {w}" for n, w in WEIGHTS.items()),
      "",
      "| rows | steps x batch | "
      + " | ".join(f"{n} share" for n in WEIGHTS)
      + " | largest error |",
      "|---|---|" + "---|" * len(WEIGHTS) + "---|",
  ]
  for r in report["proportions"]:
    kind = "packed (real tokens)" if r["packing"] else "windows"
    shares = " | ".join(f"{r['share'][n]:.4f}" for n in WEIGHTS)
    lines.append(
        f"| {kind} | {r['steps']} x {report['batch_size']} | {shares} | "
        f"{r['largest_relative_error']:.2%} |"
    )
  k = report["kill_and_resume"]
  lines += [
      "",
      f"Kill -9: killed after step {k['killed_after_logging_step']} was logged, resumed from the "
      f"checkpoint at step {k['resumed_at']}; {k['steps_compared']} logged steps after it "
      f"compared with an uninterrupted run: "
      + ("all equal bit for bit" if k["bit_exact"] else f"steps {k['steps_differing']} differ")
      + ".",
      "",
      f"Final held-out loss {k['final_eval_loss']:.4f}; by source: "
      + ", ".join(f"{n} {v:.4f}" for n, v in k["final_eval_loss_by_source"].items())
      + "; tokens seen: "
      + ", ".join(f"{n} {v:,}" for n, v in k["final_tokens_seen"].items()),
  ]
  return "\n".join(lines)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  for name in ("steps", "batch_size", "seq_len", "train_steps"):
    if FLAGS[name].value < 1:
      raise UserError(f"--{name}={FLAGS[name].value}: give a positive number")
  if FLAGS.train_steps < 40:
    raise UserError(f"--train_steps={FLAGS.train_steps}: give at least 40 (4 checkpoints)")
  args = FLAGS
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="mixture_report-"))
  report = {"cpus": os.cpu_count(), "weights": WEIGHTS, "batch_size": args.batch_size}
  try:
    mixture = make_sources(tmp)
    report["proportions"] = proportions(
        mixture, tmp / "pipeline", args.steps, args.batch_size, args.seq_len
    )
    report["kill_and_resume"] = kill_and_resume(mixture, tmp, args.train_steps)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  bench_report.print_report(report, markdown(report), args.out)


if __name__ == "__main__":
  cli.run_script(main)
