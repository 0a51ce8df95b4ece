"""DeepSeek-V3 against transformers on random configs the golden fixture does not use: for each,
a random DeepseekV3ForCausalLM (every weight perturbed, the routers' bias drawn) saved with
save_pretrained, read with load_hf, and compared: logits (float32, max |difference|), 8 greedy
tokens decoded with our latent cache against transformers' generate, the parameter counts, and
save_hf -> from_pretrained (transformers on what we wrote) reproducing transformers' logits.

    python scripts/check_deepseek.py --configs 6 --out experiments/results/interop/deepseek_v3.json

Prints (and writes) JSON: one object per config with its settings and the figures. Needs the
`hf` extra (torch, transformers).
"""

from __future__ import annotations

import numpy as np

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import hf_check

FLAGS = cli.ScriptFlags(__doc__)
hf_check.define_flags(FLAGS, configs=6, seed=1)


def random_config(rng) -> dict:
  """A small DeepseekV3Config whose every option is drawn."""
  groups = int(rng.choice([1, 2, 4]))
  experts = groups * int(rng.choice([2, 3, 4]))
  top_groups = int(rng.integers(1, groups + 1))
  top_k = int(rng.integers(1, experts // groups * top_groups + 1))
  heads = int(rng.choice([2, 3, 4]))
  config = dict(
      vocab_size=int(rng.integers(40, 120)),
      hidden_size=int(rng.choice([16, 24, 32])),
      intermediate_size=int(rng.integers(16, 64)),
      moe_intermediate_size=4 * int(rng.integers(1, 6)),  # (torch's grouped matmul: 16-byte rows)
      num_hidden_layers=int(rng.integers(2, 4)),
      num_attention_heads=heads,
      num_key_value_heads=heads,
      n_shared_experts=int(rng.integers(1, 3)),
      n_routed_experts=experts,
      routed_scaling_factor=float(np.round(rng.uniform(0.5, 3.0), 2)),
      kv_lora_rank=int(rng.choice([8, 12, 20])),
      q_lora_rank=[None, 12, 28][int(rng.integers(0, 3))],
      qk_rope_head_dim=int(rng.choice([2, 4, 8])),
      v_head_dim=int(rng.choice([6, 16, 30])),  # narrower and wider than the keys
      qk_nope_head_dim=int(rng.choice([4, 10, 16])),
      n_group=groups,
      topk_group=top_groups,
      num_experts_per_tok=top_k,
      first_k_dense_replace=int(rng.integers(0, 2)),
      norm_topk_prob=bool(rng.integers(0, 2)),
      rms_norm_eps=float(rng.choice([1e-6, 1e-5])),
      max_position_embeddings=64,
      initializer_range=0.1,
      tie_word_embeddings=bool(rng.integers(0, 2)),
      bos_token_id=None,
      eos_token_id=None,
  )
  rope = dict(rope_type="default", rope_theta=float(rng.choice([1e3, 1e4])))
  if rng.integers(0, 3):
    rope = dict(
        rope_type="yarn",
        rope_theta=rope["rope_theta"],
        factor=float(rng.choice([2.0, 4.0, 8.0])),
        original_max_position_embeddings=int(rng.choice([8, 16])),
        beta_fast=float(rng.choice([8.0, 32.0])),
        beta_slow=float(rng.choice([1.0, 2.0])),
        mscale=float(rng.choice([0.0, 0.7, 1.0])),
        mscale_all_dim=float(rng.choice([0.0, 0.5, 1.0])),
    )
  return dict(config, rope_parameters=rope)


def check(config: dict, seed: int) -> dict:
  import torch

  model, generator = hf_check.shaken_model(
      "DeepseekV3Config", "DeepseekV3ForCausalLM", config, seed
  )
  with torch.no_grad():  # the routers' bias too (a buffer: shaken_model moves only weights)
    for name, buffer in model.named_buffers():
      if name.endswith("e_score_correction_bias"):
        buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config["vocab_size"], (2, 12))
  prompt = rng.integers(0, config["vocab_size"], 5).tolist()
  _, figures = hf_check.through_load_hf(model, tokens, prompt, 8)
  return {"config": {k: v for k, v in config.items() if v is not None}, **figures}


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  hf_check.require_hf()
  rng = np.random.default_rng(FLAGS.seed)
  results = [check(random_config(rng), FLAGS.seed + i) for i in range(FLAGS.configs)]
  hf_check.write_checks(results, FLAGS.out)


if __name__ == "__main__":
  cli.run_script(main)
