"""Llama 4 (text) against transformers on random configs the golden fixture does not use: for
each, a random Llama4ForCausalLM (every weight perturbed) saved with save_pretrained, read with
load_hf (every other config run scanned), and compared: logits (float32, max |difference|) over
14 tokens, 12 greedy tokens decoded with our cache (ring caches on the chunked blocks, the
temperature at the cached positions) against transformers' generate, the parameter counts, and
save_hf -> from_pretrained (transformers on what we wrote) reproducing transformers' logits.

    python scripts/check_llama4.py --configs 8 --out experiments/results/interop/llama4_text.json

Prints (and writes) JSON: one object per config with its settings and the figures. Needs the
`hf` extra (torch, transformers).
"""

from __future__ import annotations

import numpy as np

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import hf_check

FLAGS = cli.ScriptFlags(__doc__)
hf_check.define_flags(FLAGS, configs=8, seed=1)


def random_config(rng) -> dict:
  """A small Llama4TextConfig whose every option is drawn: depth, MoE interleave step, NoPE
  interval (some longer than the model: no NoPE block), chunk (or none), q/k norm, temperature,
  GQA ratio, experts and top-k, RoPE base and Llama 3.1 scaling, tied embeddings."""
  layers = int(rng.integers(2, 6))
  kv = int(rng.choice([1, 2]))
  experts = int(rng.integers(2, 7))
  config = dict(
      vocab_size=int(rng.integers(40, 120)),
      hidden_size=int(rng.choice([16, 24, 32])),
      intermediate_size=4 * int(rng.integers(2, 8)),
      intermediate_size_mlp=4 * int(rng.integers(2, 12)),
      num_hidden_layers=layers,
      num_attention_heads=kv * int(rng.choice([1, 2, 3])),
      num_key_value_heads=kv,
      head_dim=int(rng.choice([4, 8, 12])),
      num_local_experts=experts,
      num_experts_per_tok=int(rng.integers(1, min(experts, 3) + 1)),
      interleave_moe_layer_step=int(rng.integers(1, min(layers, 3) + 1)),
      no_rope_layer_interval=int(rng.integers(2, 7)),
      attention_chunk_size=[None, 3, 4, 6][int(rng.integers(0, 4))],
      use_qk_norm=bool(rng.integers(0, 2)),
      attn_temperature_tuning=bool(rng.integers(0, 2)),
      floor_scale=int(rng.integers(2, 6)),
      attn_scale=float(np.round(rng.uniform(0.05, 0.5), 2)),
      rms_norm_eps=float(rng.choice([1e-6, 1e-5])),
      max_position_embeddings=64,
      initializer_range=0.1,
      tie_word_embeddings=bool(rng.integers(0, 2)),
      bos_token_id=None,
      eos_token_id=None,
      pad_token_id=None,
  )
  rope = dict(rope_type="default", rope_theta=float(rng.choice([1e3, 1e4, 5e5])))
  if rng.integers(0, 2):
    low = float(rng.choice([1.0, 2.0]))
    rope = dict(
        rope_type="llama3",
        rope_theta=rope["rope_theta"],
        factor=float(rng.choice([2.0, 8.0, 16.0])),
        low_freq_factor=low,
        high_freq_factor=low * float(rng.choice([1.0, 4.0])),
        original_max_position_embeddings=int(rng.choice([4, 8])),
    )
  return dict(config, rope_parameters=rope)


def check(config: dict, seed: int, scan: bool) -> dict:
  model, _ = hf_check.shaken_model("Llama4TextConfig", "Llama4ForCausalLM", config, seed)
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config["vocab_size"], (2, 14))
  prompt = rng.integers(0, config["vocab_size"], 5).tolist()
  fields, figures = hf_check.through_load_hf(model, tokens, prompt, 12, scan=scan)
  return {
      "config": {k: v for k, v in config.items() if v is not None},
      "read_as": {k: fields[k] for k in ("layer_types", "attention_chunk", "moe_every")},
      "scanned": scan,
      **figures,
  }


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  hf_check.require_hf()
  rng = np.random.default_rng(FLAGS.seed)
  results = [
      check(random_config(rng), FLAGS.seed + i, scan=i % 2 == 1) for i in range(FLAGS.configs)
  ]
  hf_check.write_checks(results, FLAGS.out)


if __name__ == "__main__":
  cli.run_script(main)
