"""Markdown table of every preset's parameter count against its published figure.

    python scripts/count_params.py [--json]

Counts come from jax.eval_shape (nothing allocated); this is the table in the README.
"""

from __future__ import annotations

import json
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_bool("json", False, "Print JSON instead of the markdown table.", flag_values=FLAGS)
ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = (
    "gpt2",
    "gpt3",
    "bert",
    "transformer",
    "vit",
    "mixtral",
    "gpt_oss",
    "qwen3_moe",
    "llama4",
    "llama",
    "mistral",
    "qwen2",
    "gemma",
    "t5",
    "bart",
    "marian",
    "qwen3",
    "gemma3",
    "olmo",
    "phi3",
    "smollm3",
)


def rows():
  from transformers_jax.models import counting
  from transformers_jax.config import ModelConfig, load_config_module

  for name in FILES:
    module = load_config_module(str(ROOT / "experiments" / f"{name}.py"))
    for preset in module.PRESETS:
      config = module.get_config(preset)
      c = ModelConfig.from_dict(config.model)
      n = counting.count(c)
      layers = (
          f"{c.encoder_layers}+{c.decoder_layers}"
          if c.family == "encoder_decoder"
          else str(c.num_layers)
      )
      published = int(config.published.params)
      yield {
          "preset": f"{name}.py:{preset}",
          "layers": layers,
          "d_model": c.d_model,
          "heads": c.num_heads,
          "params": n,
          "analytic": counting.analytic_count(c),
          "published": published or None,
          "difference": (n - published) / published if published else None,
      }


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  table = list(rows())
  if FLAGS.json:
    print(json.dumps(table))
    return
  print("| preset | layers | d_model | heads | our count | published | difference |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for r in table:
    pub = f"{r['published']:,}" if r["published"] else "—"
    diff = f"{r['difference']:+.2%}" if r["difference"] is not None else "—"
    print(
        f"| {r['preset']} | {r['layers']} | {r['d_model']} | {r['heads']} | "
        f"{r['params']:,} | {pub} | {diff} |"
    )


if __name__ == "__main__":
  cli.run_script(main)
