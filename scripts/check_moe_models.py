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

import json
import pathlib
import tempfile

import numpy as np
from absl import flags, logging

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_integer(
    "configs", 4, "Random configs per model type.", lower_bound=1, flag_values=FLAGS
)
flags.DEFINE_list("types", [], "Model types to check (default: both).", flag_values=FLAGS)
flags.DEFINE_integer("seed", 45, "Seed of the configs and the weights.", flag_values=FLAGS)
flags.DEFINE_integer("new_tokens", 10, "Greedy tokens compared.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("out", None, "Write every result as one JSON file here.", flag_values=FLAGS)
output_paths.declare(FLAGS, out=output_paths.FILE)

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


def check(model_type: str, index: int, root: pathlib.Path) -> dict:
  import jax
  import torch
  import transformers

  from transformers_jax import decode
  from transformers_jax.convert import export_hf, import_hf
  from transformers_jax.models import build_model
  from transformers_jax.run_folder.runs import Run

  config_class, model_class, draw = TYPES[model_type]
  seed = FLAGS.seed * 1000 + index
  rng = np.random.default_rng([FLAGS.seed, sorted(TYPES).index(model_type), index])
  kw = draw(rng)
  torch.manual_seed(seed)
  # transformers' reference loop over the experts (its grouped_mm wants 16-byte-aligned widths)
  eager = dict(experts_implementation="eager")
  model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kw, **eager))
  model = model.eval()
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.3 * torch.randn(p.shape, generator=g))
  hf_dir, run_dir = root / f"{model_type}_{index}", root / f"{model_type}_{index}_run"
  model.save_pretrained(hf_dir)
  scanned = bool(index % 2) and kw.get("decoder_sparse_step", 1) == 1  # (alike blocks only)
  import_hf(hf_dir, run_dir, scan_layers=scanned)
  run = Run(run_dir)
  c, (params, _) = run.model_config(), run.load_params()
  vocab, N = kw["vocab_size"], FLAGS.new_tokens
  tokens = rng.integers(0, vocab, (2, 12))
  result = dict(model_type=model_type, config=kw, scanned=scanned, rope_scaling=c.rope_scaling)

  def hf_logits(m):
    with torch.no_grad():
      return m(torch.tensor(tokens)).logits.numpy()

  want = hf_logits(model)
  got = jax.jit(build_model(c).apply)({"params": params}, tokens)["logits"]
  result["logits_max_abs_error"] = float(np.max(np.abs(np.asarray(got) - want)))
  result["logits_scale"] = float(np.max(np.abs(want)))
  prompt = [int(t) for t in tokens[0, :6]]

  def hf_greedy(cached):
    with torch.no_grad():
      generated = model.generate(
          torch.tensor([prompt]),
          attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
          max_new_tokens=N,
          do_sample=False,
          pad_token_id=0,
          use_cache=cached,
      )
    return generated[0, len(prompt) :].numpy()

  hf_tokens, uncached = hf_greedy(True), hf_greedy(False)
  result["hf_cache_equals_its_forward"] = bool(np.array_equal(hf_tokens, uncached))
  ours = np.asarray(decode.generate(c, params, [prompt], N).tokens)[0, :N]
  result["greedy_match"] = bool(np.array_equal(ours, uncached))
  result["greedy_tokens_compared"] = N
  if not result["greedy_match"]:
    result.update(hf_greedy=uncached.tolist(), ours_greedy=ours.tolist())
  export_hf(run_dir, root / f"{model_type}_{index}_out")
  out_dir = root / f"{model_type}_{index}_out"
  back = getattr(transformers, model_class).from_pretrained(out_dir, **eager)
  result["round_trip_max_abs_error"] = float(np.max(np.abs(hf_logits(back.eval()) - want)))
  result["ok"] = bool(
      result["greedy_match"]
      and result["logits_max_abs_error"] < 1e-4
      and result["round_trip_max_abs_error"] < 1e-5
  )
  return result


def _worst(results, model_type, key):
  values = [r[key] for r in results if r["model_type"] == model_type and r.get(key) is not None]
  return max(values) if values else None


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  unknown = sorted(set(FLAGS.types) - set(TYPES))
  if unknown:
    raise UserError(f"--types: no model type {unknown[0]}; the types are {', '.join(TYPES)}")
  logging.set_verbosity(logging.WARNING)
  try:
    import torch
    import transformers
  except ImportError as e:
    raise UserError(f"this script needs {e.name}: pip install -e '.[hf]'") from None
  transformers.logging.set_verbosity_error()
  results = []
  with tempfile.TemporaryDirectory(prefix="moe_models_") as tmp:
    for model_type in FLAGS.types or TYPES:
      for index in range(FLAGS.configs):
        try:
          result = check(model_type, index, pathlib.Path(tmp))
        except Exception as e:  # noqa: BLE001  (a refusal or a failure: recorded, not fatal)
          result = dict(model_type=model_type, index=index, error=f"{type(e).__name__}: {e}")
          result["ok"] = False
        print(json.dumps(result), flush=True)
        results.append(result)
  summary = {
      t: {
          "configs": sum(r["model_type"] == t for r in results),
          "ok": sum(r["ok"] for r in results if r["model_type"] == t),
          "worst_logits_error": _worst(results, t, "logits_max_abs_error"),
          "worst_round_trip_error": _worst(results, t, "round_trip_max_abs_error"),
      }
      for t in dict.fromkeys(r["model_type"] for r in results)
  }
  versions = dict(torch=torch.__version__, transformers=transformers.__version__)
  print(json.dumps({"summary": summary, **versions}, indent=1))
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(
        json.dumps({"summary": summary, **versions, "results": results}, indent=1) + "\n"
    )


if __name__ == "__main__":
  cli.run_script(main)
