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

import json
import pathlib
import tempfile

import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work
flags.DEFINE_integer("configs", 6, "Random configs to check.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("seed", 1, "Seed of the configs and weights.", flag_values=FLAGS)
flags.DEFINE_string("out", "", "Also write the JSON here.", flag_values=FLAGS)


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
  import jax
  import torch
  import transformers

  from transformers_jax import decode
  from transformers_jax.config import ModelConfig
  from transformers_jax.interop import load_hf, save_hf
  from transformers_jax.models import build_model, counting

  torch.manual_seed(seed)
  model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**config)).eval()
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.3 * torch.randn(p.shape, generator=g))
    for name, buffer in model.named_buffers():
      if name.endswith("e_score_correction_bias"):
        buffer.copy_(0.1 * torch.randn(buffer.shape, generator=g))
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config["vocab_size"], (2, 12))
  prompt = rng.integers(0, config["vocab_size"], (1, 5))
  with torch.no_grad():
    want = model(torch.from_numpy(tokens)).logits.numpy()
    greedy = model.generate(
        torch.from_numpy(prompt),
        max_new_tokens=8,
        do_sample=False,
        attention_mask=torch.ones_like(torch.from_numpy(prompt)),
        pad_token_id=0,
    )[:, 5:].numpy()
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(pathlib.Path(tmp) / "hf")
    fields, params = load_hf(pathlib.Path(tmp) / "hf")
    got = jax.jit(build_model(fields).apply)({"params": params}, tokens)["logits"]
    out = decode.generate(ModelConfig(**fields), params, [list(prompt[0])], 8)
    save_hf(pathlib.Path(tmp) / "ours", fields, params)
    back = transformers.DeepseekV3ForCausalLM.from_pretrained(pathlib.Path(tmp) / "ours").eval()
    with torch.no_grad():
      again = back(torch.from_numpy(tokens)).logits.numpy()
  hf_count = sum(p.numel() for p in model.parameters())
  return {
      "config": {k: v for k, v in config.items() if v is not None},
      "logits_max_abs_error": float(np.max(np.abs(np.asarray(got) - want))),
      "logits_scale": float(np.max(np.abs(want))),
      "greedy_equal": bool(np.array_equal(np.asarray(out.tokens)[:, :8], greedy)),
      "greedy_hf": greedy[0].tolist(),
      "greedy_ours": np.asarray(out.tokens)[0, :8].tolist(),
      "params_hf": hf_count,
      "params_ours": counting.count(fields),
      "params_analytic": counting.analytic_count(fields),
      "exported_logits_max_abs_error": float(np.max(np.abs(again - want))),
  }


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  try:
    import torch
    import transformers
  except ImportError:
    raise UserError('this script needs torch and transformers: pip install -e ".[hf]"') from None
  rng = np.random.default_rng(FLAGS.seed)
  results = [check(random_config(rng), FLAGS.seed + i) for i in range(FLAGS.configs)]
  text = json.dumps(
      {"torch": torch.__version__, "transformers": transformers.__version__, "checks": results},
      indent=1,
  )
  print(text)
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(text + "\n")


if __name__ == "__main__":
  cli.run_script(main)
