"""Decoding with the KV cache: the prompt in one pass, then one token per step inside one jit.

  generate(cfg, params, prompts, max_new_tokens, temperature=, top_k=, top_p=, seed=,
           stop_tokens=, beam_size=, alpha=)            decoder-only, prompts of any lengths
  translate(cfg, params, sources, bos_id, eos_id, ...)  encoder-decoder, beam 4 / alpha 0.6
Both return a Generation (tokens, lengths, stopped, scores; `.ids()` for lists of ids).
"""

from transformers_jax.decode.beam import beam_loop, length_penalty
from transformers_jax.decode.cache import init_cache
from transformers_jax.decode.generation import (
    Generation,
    Strategy,
    generate,
    shard_params,
    translate,
)
from transformers_jax.decode.sampling import filter_logits, sample_loop, select_tokens

__all__ = [
    "Generation",
    "Strategy",
    "beam_loop",
    "filter_logits",
    "generate",
    "init_cache",
    "length_penalty",
    "sample_loop",
    "select_tokens",
    "shard_params",
    "translate",
]
