"""Random configs of gpt_oss and qwen3_moe through `convert --from_hf` and `--to_hf`, against
transformers itself (the `hf` extra: torch, transformers): configs the fixtures
(scripts/make_hf_fixtures.py) do not use, drawn per type from a seed.

gpt_oss draws: grouped-query heads of any width, 3 to 7 experts with 1 to 4 routed, windows of
2 to 5 on every, every other or every third block (or none), YaRN or plain RoPE at another base,
the clamped SwiGLU's alpha and limit, tied or untied embeddings. qwen3_moe draws: q/k norms
over heads of any width, top-k renormalised or not, experts in every block or every second one
(decoder_sparse_step 2, dense blocks as wide as an expert), a sliding window over every block
(use_sliding_window) or none, YaRN or plain RoPE.

For each config a randomly initialised transformers model (every parameter shaken, so norms and
biases are not their initial values) is saved, imported as a run (import_hf, in the scanned
layout for every other config) and compared: the largest logit difference over two rows of 12
tokens (teacher-forced); greedy decoding with the KV cache (10 new tokens, past every window)
against transformers' generate without its cache, i.e. its forward passes (whether its cached
generate agrees is recorded); and the run exported back (export_hf) and loaded by transformers,
whose logits must equal the original's. Prints one JSON object per config and a summary; --out
writes them all.

    pip install -e ".[hf]"
    python scripts/check_moe_models.py [--configs 4] [--types gpt_oss] [--out FILE]
"""

from __future__ import annotations

import numpy as np

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import hf_check

FLAGS = cli.ScriptFlags(__doc__)

NONE = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _attention(rng):
  kv = int(rng.choice([1, 2, 3]))
  heads = kv * int(rng.choice([1, 2, 4]))
  return dict(
      hidden_size=int(rng.choice([24, 32, 40, 48])),
      num_attention_heads=heads,
      num_key_value_heads=kv,
      head_dim=int(rng.choice([8, 12, 16])),
      num_hidden_layers=int(rng.integers(2, 5)),
      vocab_size=int(rng.integers(50, 130)),
      max_position_embeddings=64,
      rms_norm_eps=float(rng.choice([1e-5, 1e-6])),
      tie_word_embeddings=bool(rng.random() < 0.3),
      initializer_range=0.1,
  )


def _rope(rng, original=16):
  theta = float(rng.choice([1000.0, 20000.0, 150000.0]))
  if rng.random() < 0.3:
    return dict(rope_type="default", rope_theta=theta)
  return dict(
      rope_type="yarn",
      rope_theta=theta,
      factor=64 / original,  # (as transformers expects: max_position_embeddings / original)
      beta_fast=float(rng.choice([8.0, 32.0])),
      beta_slow=float(rng.choice([1.0, 2.0])),
      truncate=bool(rng.random() < 0.5),
      original_max_position_embeddings=original,
  )


def gpt_oss(rng):
  kw = _attention(rng)
  layers = kw["num_hidden_layers"]
  every = int(rng.choice([0, 1, 2, 3]))
  kinds = [
      "sliding_attention" if every and i % every == 0 else "full_attention" for i in range(layers)
  ]
  experts = int(rng.integers(3, 8))
  return dict(
      NONE,
      **kw,
      intermediate_size=int(rng.integers(12, 40)),
      num_local_experts=experts,
      num_experts_per_tok=int(rng.integers(1, min(4, experts) + 1)),
      sliding_window=int(rng.integers(2, 6)),
      layer_types=kinds,
      rope_parameters=_rope(rng),
      swiglu_alpha=float(rng.choice([1.702, 1.0, 2.5])),
      swiglu_limit=float(rng.choice([0.5, 1.0, 7.0])),
  )


def qwen3_moe(rng):
  kw = _attention(rng)
  width = int(rng.integers(12, 40))
  step = int(rng.choice([1, 2]))
  experts = int(rng.integers(3, 9))
  window = bool(rng.random() < 0.4)
  return dict(
      NONE,
      **kw,
      intermediate_size=width if step > 1 else int(rng.integers(12, 60)),
      moe_intermediate_size=width,
      decoder_sparse_step=step,
      num_experts=experts,
      num_experts_per_tok=int(rng.integers(1, min(4, experts) + 1)),
      norm_topk_prob=bool(rng.random() < 0.5),
      use_sliding_window=window,
      sliding_window=int(rng.integers(3, 7)) if window else None,
      rope_parameters=_rope(rng),
  )


TYPES = {  # model type: (config class, model class, draw)
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", gpt_oss),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", qwen3_moe),
}
hf_check.define_flags(FLAGS, configs=4, seed=45, types=TYPES)


def check(model_type: str, index: int, rng, seed: int, root) -> dict:
  config_class, model_class, draw = TYPES[model_type]
  kw = draw(rng)
  # transformers' reference loop over the experts (its grouped_mm wants 16-byte-aligned widths)
  eager = dict(experts_implementation="eager")
  model, _ = hf_check.shaken_model(config_class, model_class, kw, seed, **eager)
  name = f"{model_type}_{index}"
  scanned = bool(index % 2) and kw.get("decoder_sparse_step", 1) == 1  # (alike blocks only)
  run, c, params = hf_check.import_run(model, root, name, scanned)
  tokens = rng.integers(0, kw["vocab_size"], (2, 12))
  want = hf_check.hf_logits(model, tokens)
  got = hf_check.our_logits(c, params, tokens)
  prompt = [int(t) for t in tokens[0, :6]]
  ours, hf_tokens, cache_agrees = hf_check.decoder_greedy(
      model, c, params, prompt, FLAGS.new_tokens
  )
  back = hf_check.exported_model(model, root, name, **eager)
  result = dict(
      model_type=model_type,
      config=kw,
      scanned=scanned,
      rope_scaling=c.rope_scaling,
      logits_max_abs_error=hf_check.max_abs_error(got, want),
      logits_scale=float(np.max(np.abs(want))),
      hf_cache_equals_its_forward=cache_agrees,
      **hf_check.greedy_figures(ours, hf_tokens),
      round_trip_max_abs_error=hf_check.max_abs_error(hf_check.hf_logits(back, tokens), want),
  )
  return dict(result, ok=hf_check.passed(result))


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  results = hf_check.check_types(TYPES, FLAGS, check, prefix="moe_models_")
  hf_check.write_summary(results, FLAGS.out)


if __name__ == "__main__":
  cli.run_script(main)
