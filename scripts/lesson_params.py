"""The lesson's parameter counts: GPT-2's four sizes, the GPT-3 exercise, where GPT-2 small's
parameters live. The lesson's formula is checked against the project's model (jax.eval_shape of
the presets in experiments/gpt2.py and gpt3.py; nothing is allocated).

    python scripts/lesson_params.py
"""

from __future__ import annotations

import pathlib

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)  # no flags of its own: --help prints the docstring

ROOT = pathlib.Path(__file__).resolve().parent.parent
GPT2_SIZES = (("small", 12, 768), ("medium", 24, 1024), ("large", 36, 1280), ("XL", 48, 1600))
LABELS = {
    "token_embedding": "token embedding",
    "position_embedding": "position embedding",
    "attention": "attention (12 blocks)",
    "feed_forward": "feed-forward (12 blocks)",
    "norms": "layer norms (24 + final)",
}


def gpt2_parameters(n_layers, d, vocab=50257, context=1024):
  """The lesson's formula, as written there."""
  embeddings = vocab * d + context * d
  attention = 4 * d * d + 4 * d  # W_Q, W_K, W_V, W_O and their biases
  feed_forward = 8 * d * d + 5 * d  # d -> 4d -> d, with biases
  norms = 4 * d  # two layer norms, each a scale and a shift
  return embeddings + n_layers * (attention + feed_forward + norms) + 2 * d


def preset_config(file: str, preset: str):
  from transformers_jax.config import load_config_module

  return load_config_module(str(ROOT / "experiments" / f"{file}.py")).get_config(preset)


def preset_count(file: str, preset: str) -> int:
  from transformers_jax.models import counting

  return counting.count(preset_config(file, preset).model)


def main(argv=None) -> None:
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: this script takes none")
  from transformers_jax.models import counting, flops

  for name, layers, d in GPT2_SIZES:
    print(
        f"GPT-2 {name:6} {layers:2} blocks, d = {d:4}: {gpt2_parameters(layers, d):>13,} "
        "parameters"
    )
  print()
  print("the same models built by this project (eval_shape of experiments/gpt2.py presets):")
  for name, layers, d in GPT2_SIZES:
    config = preset_config("gpt2", name.lower())
    n, published = counting.count(config.model), int(config.published.params)
    same = "equal" if n == gpt2_parameters(layers, d) else "DIFFERS"
    print(
        f"  gpt2.py:{name.lower():6} {n:>15,}  formula {same}, released checkpoint "
        f"{published:,}"
    )
  print()
  estimate = gpt2_parameters(96, 12288, context=2048)
  print("Try this 2: GPT-3, 96 blocks, d = 12,288, 50,257 tokens, 2,048 positions")
  print(
      f"  formula:                      {estimate:>17,} parameters, {estimate / 175e9 - 1:+.2%} "
      "against 175 billion"
  )
  n = preset_count("gpt3", "175b")
  print(
      f"  eval_shape of gpt3.py:175b:   {n:>17,} parameters, {n / 175e9 - 1:+.2%} "
      f"({'equal to' if n == estimate else 'differs from'} the formula)"
  )
  print()
  s = flops.summary(preset_config("gpt2", "small"))
  total = s["total"]
  print(f"where GPT-2 small's {total:,} parameters live:")
  for key, value in s["breakdown"].items():
    print(f"  {LABELS.get(key, key):<26} {value:>12,}  {value / total:6.1%}")
  print(
      f"  in the blocks: {s['blocks_share']:.1%} of all parameters (about two thirds); the "
      f"feed-forward network is {s['feed_forward_share_of_blocks']:.1%} of each block (about "
      "two thirds)"
  )


if __name__ == "__main__":
  cli.run_script(main)
