"""Bytes of the key/value cache that decoding keeps, from shapes alone (nothing is allocated):
a preset's cache at a given context length and batch, with the sliding-window ring where the
config has a static window and, for comparison, with one slot per position.

    python scripts/decode_cache_memory.py --preset experiments/mistral.py:7b-v0.1 --length 32768

prints JSON: bytes and the cached keys' shape, with the window's ring and without it. For a
model with multi-head latent attention (experiments/deepseek.py:v3) it also gives the bytes per
token, and those of the same model with plain multi-head attention of H heads of
qk_nope_head_dim (DeepSeek-V2's yardstick: the latent cache holds kv_lora_rank +
qk_rope_head_dim values per token and layer, 576 for V3, against 2 H d_h):

    python scripts/decode_cache_memory.py --preset experiments/deepseek.py:v3 --length 4096

It also gives the cache with `--kv_cache_dtype=int8` (int8 keys and values, a float32 scale per
token and kv head) and the weights' bytes as stored in the compute dtype and with generate's
`--quantization=int8` (the Block's matmul weights in int8 with a float32 scale per output
channel; embeddings, norms, biases, the router and the head in the compute dtype):

    python scripts/decode_cache_memory.py --preset experiments/llama.py:3.1-8b --length 8192
"""

import json
import math

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_string(
    "preset", "experiments/mistral.py:7b-v0.1", "A decoder preset, FILE:PRESET.", flag_values=FLAGS
)
flags.DEFINE_integer(
    "length", 32768, "Positions the cache holds (prompt + new tokens).", flag_values=FLAGS
)
flags.DEFINE_integer("batch", 1, "Rows decoded at once.", flag_values=FLAGS)
flags.DEFINE_string("dtype", "bfloat16", "Compute dtype (the cache's).", flag_values=FLAGS)
flags.DEFINE_bool(
    "loop_layers",
    False,
    "Loop over the layers rather than scan them: alternating windows (Gemma 2) are then static "
    "per layer, and only the local layers keep rings.",
    flag_values=FLAGS,
)


def cache_bytes(c, length: int, batch: int) -> dict:
  import jax
  import jax.numpy as jnp

  from transformers_jax import decode
  from transformers_jax.models import build_model

  model = build_model(c, decode=True)
  dummy = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  shapes = jax.tree_util.tree_leaves(
      jax.eval_shape(lambda d: decode.init_cache(model, d, d, d), dummy)
  )
  keys = [s for s in shapes if s.ndim >= 4]
  return {
      "bytes": sum(math.prod(s.shape) * s.dtype.itemsize for s in shapes),
      "key_shapes": sorted({str(s.shape) for s in keys}),
  }


# The Block's matmul weights that generate --quantization=int8 stores in int8: projection
# kernels (the router's excepted) and MoE experts' stacked weights; "out" contracts 2 axes
# (heads and head width), an expert's weights their second (the first is the expert).
EXPERT_WEIGHTS = ("wi", "wi_0", "wi_1", "wo")


def weight_bytes(c) -> dict:
  """The parameters' bytes in the compute dtype, and with the Block's matmul weights in int8
  plus a float32 scale per output channel (per-channel, as qwix quantizes them)."""
  import jax

  from flax import linen as nn

  from transformers_jax.models import initializer

  shapes = nn.unbox(jax.eval_shape(initializer(c), jax.random.PRNGKey(0)))
  itemsize = jax.numpy.dtype(c.dtype).itemsize
  plain = int8 = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    names = [str(getattr(k, "key", k)) for k in path]
    size = math.prod(leaf.shape)
    plain += size * itemsize
    lead = 1 if "layers" in names else 0  # a scanned stack's layer axis
    in_block = names[0] in ("decoder", "encoder") and "router" not in names
    if in_block and names[-1] == "kernel":
      contracted = math.prod(leaf.shape[lead : lead + (2 if names[-2] == "out" else 1)])
    elif in_block and names[-1] in EXPERT_WEIGHTS and len(leaf.shape) - lead == 3:
      contracted = leaf.shape[lead + 1]
    else:
      int8 += size * itemsize
      continue
    int8 += size + 4 * size // contracted
  return {"weight_bytes": plain, "weight_bytes_int8": int8}


def latent_comparison(c, latent_bytes: int) -> dict:
  """Multi-head latent attention's cache against plain multi-head attention's (H heads of
  qk_nope_head_dim, every other field as it is), per token and in all."""
  layers = c.num_layers  # (decoding runs no multi-token prediction module)
  mha = c.replace(
      kv_lora_rank=0,
      q_lora_rank=0,
      qk_nope_head_dim=0,
      qk_rope_head_dim=0,
      v_head_dim=0,
      head_dim=c.qk_nope_head_dim,
      mtp_depth=0,
  )
  mha_bytes = cache_bytes(mha, FLAGS.length, FLAGS.batch)["bytes"]
  tokens = FLAGS.length * FLAGS.batch
  return {
      "latent_values_per_token_per_layer": c.kv_lora_rank + c.qk_rope_head_dim,
      "mha_values_per_token_per_layer": 2 * c.num_heads * c.qk_nope_head_dim,
      "latent_bytes_per_token": latent_bytes // tokens,
      "mha_bytes_per_token": mha_bytes // tokens,
      "mha_cache_bytes": mha_bytes,
      "mha_over_latent": round(mha_bytes / latent_bytes, 2),
      "layers": layers,
  }


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  from transformers_jax.config import ModelConfig, load_config_module

  path, _, preset = FLAGS.preset.partition(":")
  config = load_config_module(path).get_config(preset or None)
  c = ModelConfig.from_dict(config.model).replace(
      dtype=FLAGS.dtype, param_dtype=FLAGS.dtype, max_len=max(FLAGS.length, config.model.max_len)
  )
  if FLAGS.loop_layers:
    c = c.replace(scan_layers=False)
  if c.family != "decoder":
    raise UserError(f"{FLAGS.preset} is a {c.family} model: give a decoder preset")
  ring = cache_bytes(c, FLAGS.length, FLAGS.batch)
  int8_cache = cache_bytes(c.replace(kv_cache_dtype="int8"), FLAGS.length, FLAGS.batch)
  weights = weight_bytes(c)
  full = cache_bytes(c.replace(sliding_window=0), FLAGS.length, FLAGS.batch)
  extra = latent_comparison(c, ring["bytes"]) if c.mla else {}
  print(
      json.dumps(
          {
              **extra,
              "preset": FLAGS.preset,
              "length": FLAGS.length,
              "batch": FLAGS.batch,
              "dtype": FLAGS.dtype,
              "sliding_window": c.sliding_window,
              "sliding_every": c.sliding_every,
              "scan_layers": c.scan_layers,
              "cache_bytes": ring["bytes"],
              "cache_gib": round(ring["bytes"] / 2**30, 3),
              "key_shapes": ring["key_shapes"],
              "one_slot_per_position_bytes": full["bytes"],
              "one_slot_per_position_gib": round(full["bytes"] / 2**30, 3),
              "int8_cache_bytes": int8_cache["bytes"],
              "int8_cache_gib": round(int8_cache["bytes"] / 2**30, 3),
              **weights,
              "weight_gib": round(weights["weight_bytes"] / 2**30, 3),
              "weight_int8_gib": round(weights["weight_bytes_int8"] / 2**30, 3),
          },
          indent=1,
      )
  )


if __name__ == "__main__":
  cli.run_script(main)
