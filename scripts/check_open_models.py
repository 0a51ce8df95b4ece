"""Random configs of each dense open model type, through `convert --from_hf` and `--to_hf`,
against transformers itself (the `hf` extra: torch, transformers): configs that the fixtures
(scripts/make_hf_fixtures.py) do not use, drawn per type from a seed.

For each config a randomly initialised transformers model (every parameter shaken, so norms
and biases are not their initial ones) is saved, imported as a run (import_hf, in the scanned
layout for every other config), and compared: the largest logit difference over two rows of 12
tokens (teacher-forced); greedy decoding with the KV cache (10 new tokens, past every window)
against transformers' generate without its cache, i.e. its forward passes (whether its cached
generate agrees is recorded: with a sliding window of one position its cache keeps a key too
many, and it parts from its own forward passes from the second new token on); and the run
exported back (export_hf) and loaded by transformers, whose logits must equal the original's. Encoder-decoders (Marian, BART) translate from config.json's start, end and forced
end ids. Prints one JSON object per config and a summary; --out writes them all.

    pip install -e ".[hf]"
    python scripts/check_open_models.py [--configs 3] [--types qwen3,olmo2] [--out FILE]
"""

from __future__ import annotations

import numpy as np

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import hf_check

FLAGS = cli.ScriptFlags(__doc__)

NONE = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _heads(rng):
  """(hidden, heads, kv heads, head_dim) with a random GQA ratio."""
  kv = int(rng.choice([1, 2, 3]))
  heads = kv * int(rng.choice([1, 2, 3]))
  head_dim = int(rng.choice([8, 12, 16]))
  hidden = heads * head_dim
  if hidden < 24:
    hidden *= 2
  return hidden, heads, kv, head_dim


def _base(rng, layers=(2, 4)):
  hidden, heads, kv, head_dim = _heads(rng)
  return (
      dict(
          NONE,
          vocab_size=int(rng.integers(60, 300)) | 1,  # odd
          hidden_size=hidden,
          intermediate_size=int(rng.integers(16, 80)),
          num_hidden_layers=int(rng.integers(*layers, endpoint=True)),
          num_attention_heads=heads,
          num_key_value_heads=kv,
          max_position_embeddings=64,
          rms_norm_eps=float(rng.choice([1e-5, 1e-6])),
          initializer_range=0.1,
      ),
      head_dim,
  )


def _theta(rng):
  return float(rng.choice([300.0, 5000.0, 77777.0, 1e6]))


def _kinds(rng, layers, kinds=("full_attention", "sliding_attention")):
  return [str(rng.choice(kinds)) for _ in range(layers)]


def qwen3(rng):
  kw, head_dim = _base(rng)
  window = bool(rng.integers(2))
  return dict(
      kw,
      head_dim=int(rng.choice([head_dim, head_dim * 2])),
      rope_parameters=dict(rope_type="default", rope_theta=_theta(rng)),
      attention_bias=bool(rng.integers(2)),
      use_sliding_window=window,
      sliding_window=int(rng.integers(2, 7)),
      max_window_layers=int(rng.integers(0, kw["num_hidden_layers"])),
      tie_word_embeddings=bool(rng.integers(2)),
  )


def gemma3_text(rng):
  kw, head_dim = _base(rng)
  kw.pop("rms_norm_eps")
  kw["hidden_size"] = kw["num_attention_heads"] * int(rng.choice([8, 16]))  # heads divide it
  full = dict(rope_type="default", rope_theta=_theta(rng))
  if rng.integers(2):
    full.update(rope_type="linear", factor=float(rng.choice([2.0, 8.0])))
  caps = float(rng.choice([0.0, 20.0]))
  return dict(
      kw,
      head_dim=head_dim,
      query_pre_attn_scalar=int(rng.choice([head_dim, 24])),
      sliding_window=int(rng.integers(2, 7)),
      layer_types=_kinds(rng, kw["num_hidden_layers"]),
      rope_parameters={
          "full_attention": full,
          "sliding_attention": dict(rope_type="default", rope_theta=_theta(rng)),
      },
      attn_logit_softcapping=caps or None,
      final_logit_softcapping=caps * 2 or None,
  )


def olmo2(rng):
  kw, _ = _base(rng)
  return dict(
      kw,
      rope_parameters=dict(rope_type="default", rope_theta=_theta(rng)),
      attention_bias=bool(rng.integers(2)),
      tie_word_embeddings=bool(rng.integers(2)),
  )


def olmo3(rng):
  kw = olmo2(rng)
  return dict(
      kw,
      sliding_window=int(rng.integers(2, 7)),
      layer_types=_kinds(rng, kw["num_hidden_layers"]),
      rope_parameters={
          "full_attention": dict(rope_type="default", rope_theta=_theta(rng)),
          "sliding_attention": dict(rope_type="default", rope_theta=_theta(rng)),
      },
  )


def phi3(rng):
  kw, _ = _base(rng)
  kw["hidden_size"] = kw["num_attention_heads"] * int(rng.choice([8, 16]))
  return dict(
      kw,
      original_max_position_embeddings=64,
      sliding_window=int(rng.choice([2, 3, 5])) if rng.integers(2) else None,
      rope_parameters=dict(rope_type="default", rope_theta=_theta(rng), partial_rotary_factor=1.0),
      tie_word_embeddings=bool(rng.integers(2)),
  )


def smollm3(rng):
  kw, _ = _base(rng)
  window = bool(rng.integers(2))
  return dict(
      kw,
      rope_parameters=dict(rope_type="default", rope_theta=_theta(rng)),
      no_rope_layer_interval=int(rng.integers(2, 4)),
      use_sliding_window=window,
      sliding_window=int(rng.integers(2, 7)) if window else None,
      attention_bias=bool(rng.integers(2)),
      mlp_bias=bool(rng.integers(2)),
      tie_word_embeddings=bool(rng.integers(2)),
  )


def mistral(rng):  # the ring-buffer cache: GQA, windows shorter than the generated sequence
  kw, head_dim = _base(rng)
  kw.pop("rms_norm_eps")
  return dict(
      kw,
      head_dim=head_dim,
      sliding_window=int(rng.integers(1, 7)),
      rope_parameters=dict(rope_type="default", rope_theta=_theta(rng)),
  )


def llama(rng):  # attention and MLP biases
  kw, _ = _base(rng)
  return dict(
      kw,
      attention_bias=bool(rng.integers(2)),
      mlp_bias=bool(rng.integers(2)),
      rope_parameters=dict(rope_type="default", rope_theta=_theta(rng)),
      tie_word_embeddings=bool(rng.integers(2)),
  )


def _seq2seq(rng):  # stacks of different widths and heads
  d = int(rng.choice([24, 32, 48]))
  heads = [h for h in (1, 2, 3, 4, 6, 8) if d % h == 0]
  vocab = int(rng.integers(60, 300)) | 1
  return dict(
      vocab_size=vocab,
      d_model=d,
      encoder_layers=int(rng.integers(1, 4)),
      decoder_layers=int(rng.integers(1, 4)),
      encoder_attention_heads=int(rng.choice(heads)),
      decoder_attention_heads=int(rng.choice(heads)),
      encoder_ffn_dim=int(rng.integers(16, 80)),
      decoder_ffn_dim=int(rng.integers(16, 80)),
      max_position_embeddings=64,
      init_std=0.1,
  )


def marian(rng):
  kw = _seq2seq(rng)
  end = kw["vocab_size"] - 1
  return dict(kw, pad_token_id=end, decoder_start_token_id=end, eos_token_id=0)


def bart(rng):
  return dict(_seq2seq(rng), pad_token_id=1, bos_token_id=0, eos_token_id=2)


TYPES = {  # model type: (config class, model class, draw)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", qwen3),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", gemma3_text),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", olmo2),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", olmo3),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", phi3),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", smollm3),
    "mistral": ("MistralConfig", "MistralForCausalLM", mistral),
    "llama": ("LlamaConfig", "LlamaForCausalLM", llama),
    "marian": ("MarianConfig", "MarianMTModel", marian),
    "bart": ("BartConfig", "BartForConditionalGeneration", bart),
}
SEQ2SEQ = ("marian", "bart")
hf_check.define_flags(FLAGS, configs=3, seed=45, types=TYPES)


def check(model_type: str, index: int, rng, seed: int, root) -> dict:
  import torch

  from transformers_jax import decode

  config_class, model_class, draw = TYPES[model_type]
  kw = draw(rng)
  model, _ = hf_check.shaken_model(config_class, model_class, kw, seed)
  name, scanned = f"{model_type}_{index}", bool(index % 2)
  run, c, params = hf_check.import_run(model, root, name, scanned)
  vocab, N = kw["vocab_size"], FLAGS.new_tokens
  tokens = rng.integers(3, vocab, (2, 12))
  result = dict(model_type=model_type, config=kw, scanned=scanned)
  inputs = (tokens, tokens[:, :7]) if model_type in SEQ2SEQ else (tokens,)
  want = hf_check.hf_logits(model, *inputs)
  got = hf_check.our_logits(c, params, *inputs)
  if model_type in SEQ2SEQ:
    source = [int(t) for t in tokens[0, :6]]
    with torch.no_grad():
      hf_tokens = model.generate(torch.tensor([source]), max_new_tokens=N, do_sample=False)
    hf_tokens = hf_tokens[0, 1:].numpy()
    start, end = run.hf_start_and_end_ids()
    out = decode.translate(
        c, params, [source], start, end, N, beam_size=0, forced_eos_id=run.hf_forced_eos_id()
    )
    ours = np.asarray(out.tokens)[0, : max(out.lengths[0] + out.stopped[0], 1)]
    hf_tokens = hf_tokens[: len(ours)] if out.stopped[0] else hf_tokens
  else:
    prompt = [int(t) for t in tokens[0, :6]]
    ours, hf_tokens, cache_agrees = hf_check.decoder_greedy(model, c, params, prompt, N)
    result["hf_cache_equals_its_forward"] = cache_agrees
  result["logits_max_abs_error"] = hf_check.max_abs_error(got, want)
  result.update(hf_check.greedy_figures(ours, hf_tokens))
  again = hf_check.hf_logits(hf_check.exported_model(model, root, name), *inputs)
  result["round_trip_max_abs_error"] = hf_check.max_abs_error(again, want)
  return dict(result, ok=hf_check.passed(result))


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  results = hf_check.check_types(TYPES, FLAGS, check, prefix="open_models_")
  hf_check.write_summary(results, FLAGS.out)


if __name__ == "__main__":
  cli.run_script(main)
