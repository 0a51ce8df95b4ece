"""Ring attention (modules/ring.py) against flash attention over the whole sequence, on as many
simulated CPU devices as the `context` axis has: the loss's value and its gradients with respect
to queries, keys, values and a learned score bias. The tokens are split over the devices in a
shuffled order, so only their positions say what is causal. Prints one JSON object: for each
case, the largest error of the value and of each gradient relative to that gradient's largest
entry; and the largest output of queries that may attend no key (all values 1)."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from transformers_jax.modules.flash import flash_attention
from transformers_jax.modules.masks import AttentionMask
from transformers_jax.modules.positions import ScoreBias
from transformers_jax.modules.ring import ring_attention

SHARDS = 4
B, T, H, G, K = 2, 48, 4, 2, 8  # 12 tokens a device: blocks of 8 are padded


def mask_of(case, positions, segments, valid):
  if case == "causal":  # two packed documents, a T5 bias read at the true positions
    return AttentionMask(q_segments=segments, q_positions=positions, kv_positions=positions)
  if case == "prefix":  # a prefix LM's pattern, as data: each row's prefix both ways
    prefix = jnp.array([20, 33], jnp.int32)[:B]
    return AttentionMask(q_positions=positions, kv_positions=positions, prefix=prefix, causal=True)
  return AttentionMask(kv_valid=valid)  # bidirectional, the last keys padding


def errors_of(case, mesh):
  """{"value": ..., "q": ..., "k": ..., "v": ..., "bias": ...}: ring against whole-sequence flash."""
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (B, T, H, K))
  k = jax.random.normal(keys[1], (B, T, G, K))
  v = jax.random.normal(keys[2], (B, T, G, K))
  weights = jax.random.normal(keys[3], (32, H))
  positions = jnp.broadcast_to(jnp.arange(T), (B, T))
  segments = (jnp.arange(T) >= 40).astype(jnp.int32)[None].repeat(B, 0)
  valid = jnp.arange(T)[None].repeat(B, 0) < 44
  order = np.random.RandomState(0).permutation(T)
  causal = case == "causal"  # (the prefix case's pattern is its mask's)

  def bias_of(w):
    return ScoreBias(weights=w, kind="t5", bidirectional=False) if causal else None

  def whole(q, k, v, w):
    mask = mask_of(case, positions, segments, valid)
    out = flash_attention(q, k, v, mask, causal, block_q=8, block_kv=8, bias=bias_of(w))
    return jnp.sum(jnp.sin(out))

  def ringed(q, k, v, w):
    taken = [x[:, order] for x in (q, k, v, positions, segments, valid)]
    mask = mask_of(case, *taken[3:])
    spec = P(None, "context")

    def local(q, k, v, mask, w):
      return ring_attention(q, k, v, mask, causal, "context", SHARDS, bias_of(w), blocks=(8, 8))

    mask_specs = jax.tree_util.tree_map(lambda x: spec if x.ndim == 2 else P(), mask)
    out = jax.shard_map(
        local, in_specs=(spec, spec, spec, mask_specs, P()), out_specs=spec, check_vma=False
    )(*taken[:3], mask, w)
    return jnp.sum(jnp.sin(out[:, np.argsort(order)]))

  grads = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))  # noqa: E731
  reference = grads(whole)(q, k, v, weights)
  with jax.set_mesh(mesh):
    got = grads(ringed)(q, k, v, weights)
  errors = {"value": float(abs(got[0] - reference[0]) / abs(reference[0]))}
  for name, a, b in zip(("q", "k", "v", "bias"), got[1], reference[1]):
    scale = float(jnp.max(jnp.abs(b)))
    errors[name] = float(jnp.max(jnp.abs(a - b))) / scale if scale else float(jnp.max(jnp.abs(a)))
  return errors


def lonely_output(mesh):
  """The largest output of queries in a segment no key has, all values 1: each ring step gives
  them an average of (masked) values, at most 1, and the steps must not add up."""
  ones = jnp.ones((B, T, G, K))
  q = jax.random.normal(jax.random.key(1), (B, T, H, K))
  segments = jnp.where(jnp.arange(T) < 3, 7, 0)[None].repeat(B, 0)
  mask = AttentionMask(q_segments=segments, kv_segments=jnp.zeros_like(segments))
  spec = P(None, "context")

  def local(q, k, v, mask):
    return ring_attention(q, k, v, mask, False, "context", SHARDS, blocks=(8, 8))

  mask_specs = jax.tree_util.tree_map(lambda _: spec, mask)
  with jax.set_mesh(mesh):
    out = jax.shard_map(
        local, in_specs=(spec, spec, spec, mask_specs), out_specs=spec, check_vma=False
    )(q, ones, ones, mask)
  return float(jnp.max(jnp.abs(out[:, :3])))


def main():
  mesh = jax.make_mesh((SHARDS,), ("context",), axis_types=(jax.sharding.AxisType.Auto,))
  errors = {case: errors_of(case, mesh) for case in ("causal", "bidirectional", "prefix")}
  print(json.dumps({"errors": errors, "lonely_output": lonely_output(mesh)}))


if __name__ == "__main__":
  sys.exit(main())
