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
flags.DEFINE_integer("configs", 8, "Random configs to check.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("seed", 1, "Seed of the configs and weights.", flag_values=FLAGS)
flags.DEFINE_string("out", "", "Also write the JSON here.", flag_values=FLAGS)


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
  import jax
  import torch
  import transformers

  from transformers_jax import decode
  from transformers_jax.config import ModelConfig
  from transformers_jax.interop import load_hf, save_hf
  from transformers_jax.models import build_model, counting
  from transformers_jax.modules.block import loop_to_scan

  torch.manual_seed(seed)
  model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**config)).eval()
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.3 * torch.randn(p.shape, generator=g))
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, config["vocab_size"], (2, 14))
  prompt = rng.integers(0, config["vocab_size"], (1, 5))
  with torch.no_grad():
    want = model(torch.from_numpy(tokens)).logits.numpy()
    greedy = model.generate(
        torch.from_numpy(prompt),
        max_new_tokens=12,
        do_sample=False,
        attention_mask=torch.ones_like(torch.from_numpy(prompt)),
        pad_token_id=0,
    )[:, 5:].numpy()
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(pathlib.Path(tmp) / "hf")
    fields, params = load_hf(pathlib.Path(tmp) / "hf")
    c = ModelConfig(**fields).replace(scan_layers=scan)
    run_params = loop_to_scan(params) if scan else params
    got = jax.jit(build_model(c).apply)({"params": run_params}, tokens)["logits"]
    out = decode.generate(c, run_params, [list(prompt[0])], 12)
    save_hf(pathlib.Path(tmp) / "ours", fields, params)
    back = transformers.Llama4ForCausalLM.from_pretrained(pathlib.Path(tmp) / "ours").eval()
    with torch.no_grad():
      again = back(torch.from_numpy(tokens)).logits.numpy()
  hf_count = sum(p.numel() for p in model.parameters())
  return {
      "config": {k: v for k, v in config.items() if v is not None},
      "read_as": {k: fields[k] for k in ("layer_types", "attention_chunk", "moe_every")},
      "scanned": scan,
      "logits_max_abs_error": float(np.max(np.abs(np.asarray(got) - want))),
      "logits_scale": float(np.max(np.abs(want))),
      "greedy_equal": bool(np.array_equal(np.asarray(out.tokens)[:, :12], greedy)),
      "greedy_hf": greedy[0].tolist(),
      "greedy_ours": np.asarray(out.tokens)[0, :12].tolist(),
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
  results = [
      check(random_config(rng), FLAGS.seed + i, scan=i % 2 == 1) for i in range(FLAGS.configs)
  ]
  text = json.dumps(
      {"torch": torch.__version__, "transformers": transformers.__version__, "checks": results},
      indent=1,
  )
  print(text)
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(text + "\n")


if __name__ == "__main__":
  cli.run_script(main)
