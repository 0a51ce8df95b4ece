"""Held-out loss of a language model trained on one long document with and without packing.

    python scripts/packing_long_document.py [--megabytes 5] [--steps 200] [--preset tiny]

Writes a .txt corpus of one document (`--megabytes` of the bundled corpus's text, joined), then
trains experiments/gpt2.py:<preset> on it twice, with --config.data.packing=False and True (same
seed, steps and batches), and prints one JSON object: each run's final train and held-out loss
and their ratio. Packing cuts a long document into row-sized pieces that are all trained on, so
the two held-out losses should agree closely.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.config import load_config_module

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLAGS = cli.ScriptFlags(__doc__)
_MEGABYTES = flags.DEFINE_float(
    "megabytes", 5.0, "size of the one-document corpus", flag_values=FLAGS
)
_STEPS = flags.DEFINE_integer("steps", 200, "optimizer steps of each run", flag_values=FLAGS)
_PRESET = flags.DEFINE_string("preset", "tiny", "experiments/gpt2.py preset", flag_values=FLAGS)


def one_document(path: pathlib.Path, size: int) -> None:
  from transformers_jax.data import build_corpus

  corpus = build_corpus(size + (1 << 20))
  text = "\n".join(t for _, t in corpus.train_docs).encode("utf-8")[:size]
  path.write_bytes(text.decode("utf-8", "ignore").encode("utf-8"))


def run(corpus: pathlib.Path, workdir: pathlib.Path, packing: bool) -> dict:
  from transformers_jax.train.entry import train

  config = load_config_module(str(ROOT / "experiments" / "gpt2.py")).get_config(_PRESET.value)
  config.data.path, config.data.packing, config.data.tokenize_workers = str(corpus), packing, 1
  config.steps, config.eval_every, config.checkpoint_every = _STEPS.value, 0, 0
  config.log_every, config.sample.max_new_tokens = _STEPS.value, 0
  result = train(config, str(workdir))
  return {"train_loss": result["loss"], "eval_loss": result["eval_loss"]}


def main(argv) -> int:
  cli.parse_script_flags(FLAGS, argv, "packing_long_document.py")
  if not _MEGABYTES.value > 0 or _STEPS.value < 1:
    raise UserError("--megabytes and --steps must be positive")
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    corpus = tmp / "one_document.txt"
    one_document(corpus, int(_MEGABYTES.value * 1_000_000))
    out = {"corpus_bytes": corpus.stat().st_size, "preset": _PRESET.value, "steps": _STEPS.value}
    for packing in (False, True):
      out["packed" if packing else "unpacked"] = run(corpus, tmp / f"run_{packing}", packing)
  out["eval_loss_ratio"] = out["packed"]["eval_loss"] / out["unpacked"]["eval_loss"]
  print(json.dumps(out, indent=1))
  return 0


if __name__ == "__main__":
  cli.run_script(main)
