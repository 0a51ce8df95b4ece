"""Decoding speed of a GPT-2-small-sized model with random weights, as JSON:

    python scripts/bench_decode.py [--positions 64,256,1024] [--new_tokens 32] [--batches 1,16]

- cached: time per generated token around each position p with the KV cache (greedy
  `decode.generate` from a p-token prompt: (time for 1 + n tokens - time for 1 token) / n, so the
  prefill is left out); the goal is a flat line.
- uncached: time per token recomputing the whole prefix (one jit forward pass over p tokens,
  only the last position unembedded).
- tokens_per_s: decode throughput at each batch size (prompt 64 tokens, n new tokens per row),
  prefill excluded; end_to_end_tokens_per_s includes it.
Every jit program is compiled (and run once) before it is timed. GPT-2 small has 1,024 learned
positions; the model here has `--max_len` (default 2,048) so that tokens at position 1,024 and
beyond exist; nothing else about the per-token cost changes.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
cli.define_integer_list(
    "positions", "64,256,1024", "Prompt lengths at which to time a token.", FLAGS
)
flags.DEFINE_integer(
    "new_tokens", 32, "Tokens generated per timing (n).", lower_bound=1, flag_values=FLAGS
)
cli.define_integer_list("batches", "1,16", "Batch sizes for tokens/s.", FLAGS)
flags.DEFINE_integer("max_len", 2048, "Position table size.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer(
    "repeats", 3, "Timed runs per measurement (the best is kept).", lower_bound=1, flag_values=FLAGS
)
flags.DEFINE_integer(
    "uncached_repeats",
    2,
    "Timed runs of the no-cache forward (the best).",
    lower_bound=1,
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "scan_layers", False, "Scanned layers (faster compile) instead of looped.", flag_values=FLAGS
)


def gpt2_small(max_len: int, scan: bool):
  from transformers_jax.config import ModelConfig

  return ModelConfig(
      family="decoder",
      num_layers=12,
      d_model=768,
      num_heads=12,
      vocab_size=50257,
      max_len=max_len,
      positions="learned",
      norm_placement="pre",
      activation="gelu_tanh",
      tie_embeddings=True,
      scan_layers=scan,
  )


def random_params(cfg, seed: int = 0):
  import jax
  import jax.numpy as jnp

  from transformers_jax.models import param_shapes

  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.standard_normal(s.shape, np.float32) * cfg.init_std),
      param_shapes(cfg),
  )


def best_time(fn, repeats: int) -> float:
  fn()  # compile and warm up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return min(times)


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  n = FLAGS.new_tokens
  positions, batches = FLAGS.positions, FLAGS.batches
  longest = max(positions + [64]) + 1 + n  # the prompt, then 1 + n tokens
  if longest > FLAGS.max_len:
    raise UserError(
        f"--positions={max(positions)} with --new_tokens={n} reaches position {longest}, "
        f"past --max_len={FLAGS.max_len}: raise --max_len or lower --positions"
    )
  import jax
  import jax.numpy as jnp

  from transformers_jax import decode
  from transformers_jax.models import build_model

  cfg = gpt2_small(FLAGS.max_len, FLAGS.scan_layers)
  params = random_params(cfg)
  rng = np.random.default_rng(1)

  def prompts(batch, length):
    return rng.integers(0, cfg.vocab_size, (batch, length)).tolist()

  def gen_time(batch, length, new):
    p = prompts(batch, length)
    return best_time(lambda: decode.generate(cfg, params, p, new), FLAGS.repeats)

  model = build_model(cfg)

  @jax.jit
  def forward(params, tokens):  # the next token without a cache: the whole prefix again
    logits = model.apply({"params": params}, tokens, last_logits_only=True)["logits"]
    return jnp.argmax(logits[:, -1], axis=-1)

  cached, uncached, prefill = {}, {}, {}
  for p in positions:
    t1 = gen_time(1, p, 1)
    tn = gen_time(1, p, 1 + n)
    cached[p] = (tn - t1) / n
    prefill[p] = t1
    tokens = jnp.asarray(prompts(1, p), jnp.int32)
    uncached[p] = best_time(
        lambda t=tokens: forward(params, t).block_until_ready(), FLAGS.uncached_repeats
    )
    print(
        f"position {p}: cached {cached[p] * 1e3:.1f} ms/token, uncached "
        f"{uncached[p] * 1e3:.1f} ms/token",
        file=sys.stderr,
        flush=True,
    )

  throughput, end_to_end = {}, {}
  for b in batches:
    t1 = gen_time(b, 64, 1)
    tn = gen_time(b, 64, 1 + n)
    throughput[b] = b * n / (tn - t1)
    end_to_end[b] = b * (1 + n) / tn
    print(f"batch {b}: {throughput[b]:.1f} tokens/s", file=sys.stderr, flush=True)

  ms = lambda d: {str(k): round(v * 1e3, 2) for k, v in d.items()}  # noqa: E731
  result = {
      "device": f"{jax.devices()[0].platform} ({platform.processor() or platform.machine()}, "
      f"{os.cpu_count()} cores visible)",
      "model": dict(
          layers=cfg.num_layers,
          d_model=cfg.d_model,
          heads=cfg.num_heads,
          vocab=cfg.vocab_size,
          max_len=cfg.max_len,
          scan_layers=cfg.scan_layers,
          parameters=int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params))),
          dtype=cfg.dtype,
      ),
      "new_tokens_per_timing": n,
      "cached_ms_per_token": ms(cached),
      "uncached_ms_per_token": ms(uncached),
      "cached_over_uncached_speedup": {
          str(p): round(uncached[p] / cached[p], 1) for p in positions
      },
      "prefill_plus_first_token_ms": ms(prefill),
      "tokens_per_s": {f"batch_{b}": round(v, 1) for b, v in throughput.items()},
      "end_to_end_tokens_per_s": {f"batch_{b}": round(v, 1) for b, v in end_to_end.items()},
      "gpu": "not measured: no GPU was available to this session",
  }
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  cli.run_script(main)
