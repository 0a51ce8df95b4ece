"""flash (blockwise, plain JAX) and splash (TPU Pallas, interpret mode here) attention against the
einsum reference: outputs and gradients, every mask the families build, every family's forward,
the compiled memory of a long-sequence train step, and the config's refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model
from transformers_jax.modules.attention import (
    AUTO_FLASH_MIN_LENGTH,
    attend,
    choose_impl,
    max_attention_logit,
)
from transformers_jax.modules.masks import AttentionMask

from conftest import assert_close

KEY = jax.random.PRNGKey(0)


def packed(B, T, lengths):
  """Segment ids [B, T]: segments of the given lengths numbered from 1, the rest padding (0)."""
  ids = np.zeros((B, T), np.int32)
  at = 0
  for i, n in enumerate(lengths):
    ids[:, at : at + n] = i + 1
    at += n
  return jnp.asarray(ids)


def key_valid(B, S, lengths):
  return jnp.arange(S)[None, :] < jnp.asarray(lengths)[:, None]


def qkv(T, S, H, G, K=16, B=2):
  keys = jax.random.split(KEY, 4)
  q = jax.random.normal(keys[0], (B, T, H, K))
  k, v = (jax.random.normal(kk, (B, S, G, K)) for kk in keys[1:3])
  return q, k, v, jax.random.normal(keys[3], (B, T, H, K))


def outputs_and_grads(impl, q, k, v, cot, mask, causal, block):
  def f(q, k, v):
    return attend(q, k, v, mask, causal, impl=impl, block_q=block, block_kv=block)

  @jax.jit  # the forward and its VJP as one program
  def run(q, k, v, cot):
    out, vjp = jax.vjp(f, q, k, v)
    return (out, *vjp(cot))

  return run(q, k, v, cot)


# (T, S, heads, kv heads, causal, mask): each case combines several features (compiles are what
# costs); T = 100 and 130 are not multiples of the 32-query blocks.
FLASH_CASES = {
    "causal_packed_gqa": (
        130,
        130,
        4,
        2,
        True,
        AttentionMask(q_segments=packed(2, 130, [40, 50, 30])),  # padding attends padding
    ),
    "bidirectional_padded_mqa": (
        100,
        100,
        4,
        1,
        False,
        AttentionMask(kv_valid=key_valid(2, 100, [100, 61])),
    ),
    "cross_packed_padded": (
        60,
        130,
        4,
        2,
        False,
        AttentionMask(
            q_segments=packed(2, 60, [30, 30]),
            kv_segments=packed(2, 130, [70, 60]),
            kv_valid=key_valid(2, 130, [130, 120]),
        ),
    ),
}


@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_flash_equals_einsum_outputs_and_gradients(case):
  T, S, H, G, causal, mask = FLASH_CASES[case]
  q, k, v, cot = qkv(T, S, H, G)
  want = outputs_and_grads("einsum", q, k, v, cot, mask, causal, 32)
  got = outputs_and_grads("flash", q, k, v, cot, mask, causal, 32)
  for a, b in zip(got, want):
    assert_close(a, b)


def test_blockwise_max_logit_equals_the_written_out_one():
  T, S, H, G, causal, mask = FLASH_CASES["cross_packed_padded"]  # T = 60: queries padded
  q, k, _, _ = qkv(T, S, H, G)
  blocks = max_attention_logit(q, k, mask, causal, (32, 32))
  assert_close(blocks, max_attention_logit(q, k, mask, causal))
  q, k, _, _ = qkv(130, 130, 4, 2)
  assert_close(
      max_attention_logit(q, k, None, True, (32, 32)), max_attention_logit(q, k, None, True)
  )


def test_flash_causal_by_positions_on_a_permuted_sequence():
  """A sequence stored out of order, with its true positions in the mask, attends as the sorted
  one does (the blocks entirely above the diagonal in position order are skipped by lax.cond)."""
  T, H = 96, 4
  q, k, v, cot = qkv(T, T, H, 2)
  segments = packed(2, T, [50, 46])
  order = jnp.concatenate([jnp.arange(0, T, 2), jnp.arange(1, T, 2)[::-1]])  # zig-zag
  natural = outputs_and_grads("einsum", q, k, v, cot, AttentionMask(q_segments=segments), True, 16)
  positions = jnp.broadcast_to(order, (2, T))
  mask = AttentionMask(q_segments=segments[:, order], q_positions=positions, kv_positions=positions)
  got = outputs_and_grads(
      "flash", q[:, order], k[:, order], v[:, order], cot[:, order], mask, True, 16
  )
  for a, b in zip(got, natural):
    assert_close(a, b[:, order])


# splash in interpret mode is slow on a CPU: this case covers bidirectional cross-attention,
# key padding, MQA and lengths off the 128 grid; causal, packing and GQA are the sharded case's
# (test_splash_sharded_over_batch_and_heads_equals_einsum)
SPLASH_CASES = {
    "cross_padded_mqa": (
        100,
        180,
        2,
        1,
        False,
        AttentionMask(kv_valid=key_valid(1, 180, [150])),
    ),
}


@pytest.mark.parametrize("case", list(SPLASH_CASES))
def test_splash_equals_einsum_outputs_and_gradients(case):
  T, S, H, G, causal, mask = SPLASH_CASES[case]
  q, k, v, cot = qkv(T, S, H, G, B=1)
  want = outputs_and_grads("einsum", q, k, v, cot, mask, causal, 128)
  got = outputs_and_grads("splash", q, k, v, cot, mask, causal, 128)
  for a, b in zip(got, want):
    assert_close(a, b)


# ------------------------------------------------------------------ every family
TINY = dict(d_model=32, num_heads=4, num_kv_heads=2, vocab_size=50, max_len=48, num_layers=1)
BLOCKS = dict(attention_block_q=16, attention_block_kv=16)


def family_inputs(c):
  B, T = 2, 40
  tok = jax.random.randint(KEY, (B, T), 0, c.vocab_size)
  valid = key_valid(B, T, [40, 29]).astype(jnp.int32)
  if c.family == "decoder":  # packed rows: padding (segment 0) attends padding
    return (tok,), dict(segment_ids=packed(B, T, [15, 20]))
  if c.family == "encoder":
    return (tok,), dict(attention_mask=valid)
  if c.family == "encoder_decoder":
    src = jax.random.randint(jax.random.PRNGKey(1), (B, 33), 0, c.vocab_size)
    return (src, tok, key_valid(B, 33, [33, 20]).astype(jnp.int32), valid), {}
  return (jax.random.uniform(KEY, (B, 32, 32, 3)),), {}


@pytest.mark.parametrize(
    "family,extra",
    [
        ("decoder", dict(positions="rope")),
        ("encoder", dict(head="mlm")),
        ("encoder_decoder", {}),
        ("vit", dict(image_size=32, patch_size=8, num_classes=3)),  # 17 tokens: blocks pad
    ],
)
def test_every_family_forward_with_flash_equals_einsum(family, extra):
  c = ModelConfig(family=family, attention_impl="einsum", **TINY, **BLOCKS, **extra)
  args, kwargs = family_inputs(c)
  model = build_model(c)
  params = nn.unbox(jax.jit(model.init)(KEY, *args, **kwargs)["params"])
  want = jax.jit(model.apply)({"params": params}, *args, **kwargs)
  got = jax.jit(build_model(c.replace(attention_impl="flash")).apply)(
      {"params": params}, *args, **kwargs
  )
  for name in ("hidden", "logits"):
    if name in want:
      assert_close(got[name], want[name])


# ------------------------------------------------------------------ memory at long T
def test_flash_train_step_at_8192_tokens_needs_an_eighth_of_einsums_temporaries(experiment):
  """XLA's own figure for the compiled step of a GPT-2-tiny-shaped model (one layer) at
  T = 8,192: einsum stores [H, T, T] float32 scores, flash a block of them."""
  from transformers_jax.train.compile import compile_train_step

  temps = {}
  for impl in ("flash", "einsum"):
    config = experiment("gpt2", "tiny")
    config.model.update(max_len=8192, num_layers=1, attention_impl=impl)
    config.update(seq_len=8192, batch_size=1)
    compiled, _, _ = compile_train_step(config)
    temps[impl] = compiled.memory_analysis().temp_size_in_bytes
  assert temps["einsum"] > 4 * 8192**2 * 4  # at least one layer's scores, written out
  assert temps["flash"] <= temps["einsum"] / 8, temps


# ------------------------------------------------------------------ choosing and refusing
def test_auto_takes_flash_on_cpu_at_long_sequences_and_einsum_with_dropout():
  short = jax.ShapeDtypeStruct((1, AUTO_FLASH_MIN_LENGTH - 1, 4, 16), jnp.float32)
  long = jax.ShapeDtypeStruct((1, AUTO_FLASH_MIN_LENGTH, 4, 16), jnp.float32)
  assert choose_impl("auto", short, short, dropout=False) == "einsum"
  assert choose_impl("auto", long, long, dropout=False) == "flash"
  assert choose_impl("auto", short, long, dropout=False) == "flash"  # cross: S is long
  assert choose_impl("auto", long, long, dropout=True) == "einsum"
  assert choose_impl("splash", long, long, dropout=False) == "splash"


@pytest.mark.parametrize(
    "fields,words",
    [
        (dict(attention_impl="flash", attention_dropout=0.1), "attention_dropout"),
        (dict(attention_impl="splash", attention_dropout=0.1), "attention_dropout"),
        (dict(attention_block_q=100), "attention_block_q"),
        (dict(attention_block_kv=0), "attention_block_kv"),
        (dict(attention_impl="splash", attention_block_q=64), "attention_block_q"),
    ],
)
def test_config_refuses_what_flash_and_splash_cannot_do(fields, words):
  with pytest.raises(ValueError, match=f"model.{words}="):
    ModelConfig(**fields)


def test_splash_lowers_for_a_tpu_topology_as_pallas_kernels_under_shard_map(experiment):
  """Compiled ahead of time for 4 v5e chips (data 2 x tensor 2) from this CPU host, `auto`
  takes splash: the step holds the three Pallas TPU kernels (forward, dq, dkv; the layers call
  them as shared functions), run on each device's part of the batch and heads (shard_map), not
  in interpret mode."""
  from transformers_jax.train.compile import devices_for, lower_train_step

  config = experiment("gpt2", "tiny")
  config.mesh.update(topology="v5e:2x2", data=-1, tensor=2)
  lowered, *_ = lower_train_step(config, devices_for(config))
  text = lowered.as_text()
  assert text.count("tpu_custom_call") >= 3
  assert "manual" in text  # the shard_map's manual partitioning


def test_splash_sharded_over_batch_and_heads_equals_einsum():
  """On 4 simulated devices (data 2 x tensor 2) splash runs under shard_map on each device's
  part of the batch and heads, and still equals the reference, gradients included."""
  from conftest import run_worker

  result = run_worker("attention_worker.py")
  assert result["manual"]
  assert max(result["errors"]) <= 1e-5, result
