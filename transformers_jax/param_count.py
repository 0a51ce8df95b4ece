"""Print a model's parameter count, the analytic formula's count, the published figure, a
per-component breakdown and training FLOPs per token.

    python -m transformers_jax.param_count --config experiments/gpt2.py:small [--json]
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.models import counting, flops
from transformers_jax.run_folder.runs import IMPLEMENTATION_FIELDS
from transformers_jax.train import field_checks

flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")
cli.define_config_flag()
FLAGS = flags.FLAGS

LABELS = {
    "token_embedding": "token embedding",
    "position_embedding": "position embedding",
    "type_embedding": "token-type embedding",
    "patch_embedding": "patch embedding (+ class token)",
    "attention": "attention",
    "feed_forward": "feed-forward",
    "norms": "norms",
    "gains": "residual gains (norm placement)",
    "position_bias": "relative position bias",
    "head": "head / pooler / unembedding",
    "lora": "LoRA adapters",
    "mtp": "multi-token prediction modules",
}


def render(s: dict, name: str) -> str:
  total = s["total"]
  lines = [
      f"{name}",
      f"  parameters (eval_shape): {total:>17,}",
      f"  analytic formula:        {s['analytic']:>17,}",
  ]
  overridden = s.get("published_overridden")
  if s["published"] and overridden:
    more = f" and {len(overridden) - 1} more" if len(overridden) > 1 else ""
    lines.append(
        f"  published:               {s['published']:>17,}  (of the preset as written, not "
        f"this model: {overridden[0]}{more} overridden; {s['published_source']})"
    )
  elif s["published"]:
    diff = (total - s["published"]) / s["published"] * 100
    lines.append(
        f"  published:               {s['published']:>17,}  ({diff:+.2f}%; "
        f"{s['published_source']})"
    )
  if "without_mtp" in s:
    lines.append(f"  without the MTP modules: {s['without_mtp']:>17,}  (what inference runs)")
  if s.get("router_bias_state"):
    lines.append(
        f"  routers' bias (state):   {s['router_bias_state']:>17,}  (in the parameter tree, "
        "not trained, counted in neither figure)"
    )
  if s["active_per_token"] != total:
    lines.append(f"  active per token (MoE):  {s['active_per_token']:>17,}")
  if s["trainable"] != total:
    lines.append(f"  trained (LoRA adapters): {s['trainable']:>17,}  (the rest frozen)")
  lines.append("  breakdown:")
  for key, n in s["breakdown"].items():
    lines.append(f"    {LABELS.get(key, key):<32} {n:>17,}  {n / total:6.1%}")
  lines.append(
      f"  in the blocks: {s['blocks_share']:.1%} of all parameters; feed-forward is "
      f"{s['feed_forward_share_of_blocks']:.1%} of the blocks"
  )
  lines.append(f"  training FLOPs per token: {flops.flops_text(s)}")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}: pass options as --flag=value")
  if FLAGS.config is None:
    raise UserError("--config is required, e.g. --config experiments/gpt2.py:small")
  field_checks.check_model(counting.as_model_config(FLAGS.config.model))
  s = flops.summary(FLAGS.config)
  if s["published"]:  # the preset's figure, which architecture overrides make another model's
    given = config_flags.get_override_values(FLAGS["config"])
    s["published_overridden"] = architecture_overrides(given)
  if FLAGS.json:
    print(json.dumps(s))
  else:
    print(render(s, flags.FLAGS["config"].config_filename))


def architecture_overrides(given) -> list[str]:
  """Of the command line's overrides (`given`: {dotted field: value}), the --config.model.*
  ones that change what the model is (all but the fields that say how it is computed, and the
  parameters' storage dtype)."""
  how = set(IMPLEMENTATION_FIELDS) | {"model.param_dtype"}
  return [f"--config.{f}" for f in given if f.startswith("model.") and f not in how]


if __name__ == "__main__":
  cli.run(main)
