"""Options of the one Block for today's dense open models: per-layer attention patterns
(model.layer_types: full, sliding with its own RoPE base, chunked, NoPE), q/k norm kinds (per
head, over the whole projection, parameterless), feed-forward biases apart from attention's,
and an encoder-decoder whose decoder has its own heads and width. Decoding with each is in
test_decode.py (the cache equals the forward pass), Hugging Face models using them in
test_interop.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax import decode
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, counting, param_shapes
from transformers_jax.modules import layer_types
from transformers_jax.modules.block import loop_to_scan

KEY = jax.random.PRNGKey(0)
SMALL = dict(d_model=32, num_heads=4, vocab_size=40, max_len=32, init_std=0.3, positions="rope")
TOKENS = jax.random.randint(KEY, (2, 12), 0, 40)


def logits(c, params, tokens=TOKENS):
  return np.asarray(jax.jit(build_model(c).apply)({"params": params}, tokens)["logits"])


def init(c):
  return nn.unbox(jax.jit(build_model(c).init)(KEY, TOKENS)["params"])


def test_each_layer_type_is_the_model_it_stands_for():
  """A NoPE layer is the block without positions; a sliding layer with rope_local_theta is a
  sliding window over RoPE at that base; a chunked layer's queries see their own chunk only."""
  one = dict(SMALL, num_layers=1)
  c = ModelConfig(**one, layer_types="nope")
  params = init(c)
  np.testing.assert_allclose(
      logits(c, params), logits(ModelConfig(**dict(one, positions="none")), params), atol=1e-5
  )
  c = ModelConfig(**one, layer_types="sliding", sliding_window=3, rope_local_theta=50.0)
  plain = ModelConfig(**one, sliding_window=3, rope_theta=50.0)
  np.testing.assert_allclose(logits(c, params), logits(plain, params), atol=1e-5)
  c = ModelConfig(**one, layer_types="chunked", attention_chunk=5)
  base = logits(c, params)
  changed = logits(c, params, TOKENS.at[:, 3].set((TOKENS[:, 3] + 1) % 40))
  assert np.allclose(base[:, 5:], changed[:, 5:], atol=1e-6)  # later chunks: unchanged
  assert not np.allclose(base[:, 3:5], changed[:, 3:5], atol=1e-4)  # its own chunk: changed


def test_a_period_of_layer_types_runs_alike_looped_scanned_and_in_every_attention_impl():
  """Four blocks over a period of three (sliding at its own RoPE base, chunked, NoPE): the
  scanned stack (windows, chunks and frequencies traced; rematerialised) equals the looped one,
  and einsum, flash (blocks of 8 queries and keys) and the fused call agree."""
  kw = dict(SMALL, num_layers=4, layer_types="sliding,chunked,nope", num_kv_heads=2)
  c = ModelConfig(**kw, sliding_window=3, attention_chunk=4, rope_local_theta=50.0)
  params = init(c)
  assert layer_types.names(c, 4) == ["sliding", "chunked", "nope", "sliding"]
  want = logits(c.replace(attention_impl="einsum"), params)
  flash = dict(attention_impl="flash", attention_block_q=8, attention_block_kv=8)
  for changes, p in [
      (dict(scan_layers=True, attention_impl="einsum", remat="full"), loop_to_scan(params)),
      (dict(scan_layers=True, **flash), loop_to_scan(params)),
      (dict(attention_impl="fused"), params),
  ]:
    np.testing.assert_allclose(logits(c.replace(**changes), p), want, atol=2e-5, err_msg=changes)


def test_looped_sliding_and_chunked_layers_cache_rings_of_their_span():
  """Looped: a ring of window (or chunk) slots per such layer, one slot per position in full
  and NoPE layers; scanned, where the layers differ, every layer one slot per position."""
  kw = dict(SMALL, num_layers=3, layer_types="sliding,chunked,nope", sliding_window=3)
  dummy = jnp.zeros((2, 12), jnp.int32)

  def slots(**extra):
    model = build_model(ModelConfig(**kw, attention_chunk=5, **extra), decode=True)
    cache = decode.init_cache(model, dummy, dummy, dummy)["decoder"]
    return {k: v["self_attn"]["cached_key"].shape[-2] for k, v in cache.items()}

  assert slots() == {"layer_0": 3, "layer_1": 5, "layer_2": 12}
  assert slots(scan_layers=True) == {"layers": 12}


def test_qk_norm_kinds():
  """head: one gain vector over head_dim; full: over the whole projection (OLMo 2: H*K and
  G*K); l2: no parameters, each head's queries and keys at unit RMS. Counted exactly."""
  c = ModelConfig(**SMALL, num_layers=1, num_kv_heads=2, qk_norm=True, norm="rmsnorm")
  shapes = {}
  for kind in ("head", "full", "l2"):
    ck = c.replace(qk_norm_kind=kind)
    tree = param_shapes(ck)
    attn = tree["decoder"]["layer_0"]["self_attn"]
    shapes[kind] = {k: v["scale"].shape for k, v in attn.items() if k.endswith("_norm")}
    parts = counting.tree_breakdown(tree, ck)
    total = sum(v for k, v in parts.items() if k != "blocks")
    assert counting.count(ck, tree) == counting.analytic_count(ck) == total
  assert shapes == {
      "head": {"query_norm": (8,), "key_norm": (8,)},
      "full": {"query_norm": (32,), "key_norm": (16,)},
      "l2": {},
  }
  from transformers_jax.modules.attention import qk_norm

  x = jax.random.normal(KEY, (1, 3, 4, 8)) * 5
  y = qk_norm(c.replace(qk_norm_kind="l2"), x, "query_norm")
  np.testing.assert_allclose(jnp.sqrt(jnp.mean(y**2, -1)), 1.0, rtol=1e-4)


@pytest.mark.parametrize(
    "extra",
    [
        dict(family="decoder", use_bias=True, ffn_bias=False, activation="swiglu"),
        dict(family="decoder", use_bias=False, ffn_bias=True),
        dict(family="decoder", feed_forward="moe", ffn_bias=False, num_experts=4),
        dict(family="encoder_decoder", decoder_num_heads=2, decoder_d_ff=24, lora_rank=2),
        dict(family="encoder_decoder", positions="t5", decoder_num_heads=8, num_decoder_layers=3),
    ],
)
def test_feed_forward_biases_and_decoder_shapes_are_counted_exactly(extra):
  """eval_shape's count, the analytic formula and param_count's breakdown (which sums to the
  total) agree; the decoder's own heads and width show in its parameters."""
  c = ModelConfig(**dict(SMALL, num_layers=2, **extra))
  shapes = nn.unbox(jax.eval_shape(lambda: build_model(c).init(KEY, *inputs(c))))["params"]
  parts = counting.tree_breakdown(shapes, c)
  assert counting.count(c) == counting.analytic_count(c)
  assert sum(v for k, v in parts.items() if k != "blocks") == counting.count(c)
  if c.family == "decoder":
    ffn = shapes["decoder"]["layer_0"]["ffn"]
    assert ("bo" in ffn or isinstance(ffn["wo"], dict) and "bias" in ffn["wo"]) == c.has_ffn_bias
  else:
    layer = shapes["decoder"]["layer_0"]
    heads = c.stack_config("decoder").num_heads
    assert layer["self_attn"]["query"]["kernel"].shape[1] == heads
    assert layer["cross_attn"]["query"]["kernel"].shape[1] == heads
    assert shapes["encoder"]["layer_0"]["self_attn"]["query"]["kernel"].shape[1] == c.num_heads


def inputs(c):
  if c.family == "encoder_decoder":
    return TOKENS, TOKENS[:, :5]
  return (TOKENS,)


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(layer_types="sliding,spiral"), "layer_types"),
        (dict(layer_types="sliding"), "sliding_window"),
        (dict(layer_types="full,full", sliding_window=4), "sliding_window"),
        (dict(layer_types="chunked"), "attention_chunk"),
        (dict(attention_chunk=8), "attention_chunk"),
        (dict(layer_types="sliding", sliding_window=4, sliding_every=2), "sliding_every"),
        (dict(layer_types="nope", positions="learned"), "layer_types"),
        (dict(rope_local_theta=100.0), "rope_local_theta"),
        (dict(family="encoder", layer_types="sliding", sliding_window=4), "layer_types"),
        (dict(qk_norm_kind="full"), "qk_norm_kind"),
        (dict(qk_norm=True, qk_norm_kind="whole"), "qk_norm_kind"),
        (dict(decoder_num_heads=2), "decoder_num_heads"),
        (dict(family="encoder_decoder", decoder_num_heads=3), "decoder_num_heads"),
        (dict(family="encoder_decoder", num_kv_heads=4, decoder_num_heads=2), "num_kv_heads"),
        (dict(family="encoder_decoder", decoder_d_ff=0), "decoder_d_ff"),
    ],
)
def test_each_new_setting_that_cannot_work_is_one_line_naming_its_field(changes, field):
  with pytest.raises(ValueError, match=rf"^model\.{field}=[^\n]*: [^\n]+$"):
    ModelConfig(**dict(SMALL, num_layers=2, **changes))
