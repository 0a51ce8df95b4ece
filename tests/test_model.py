"""Behaviour of the shared block and the four families on tiny configs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, example_inputs
from transformers_jax.modules.attention import attend
from transformers_jax.modules.block import Block, loop_to_scan, scan_to_loop
from transformers_jax.modules.feed_forward import route
from transformers_jax.modules.positions import apply_rope, sinusoidal_table

from conftest import lesson_positional_encoding

KEY = jax.random.PRNGKey(0)
SMALL = dict(num_layers=2, d_model=32, num_heads=4, vocab_size=50, max_len=16)


# Compiled as one program each (a config is hashable): run op by op, every operation of a model
# would be a compilation of its own.
@functools.partial(jax.jit, static_argnums=0)
def init(cfg, *inputs):
  return nn.unbox(build_model(cfg).init(KEY, *inputs)["params"])


@functools.partial(jax.jit, static_argnums=0)
def forward(cfg, params, *inputs):
  return build_model(cfg).apply({"params": params}, *inputs)


def tokens(seed=1, shape=(2, 12), vocab=50):
  return jax.random.randint(jax.random.PRNGKey(seed), shape, 0, vocab)


# ------------------------------------------------------------------ every family, tiny preset
FAMILIES = [("gpt2", "tiny"), ("bert", "tiny"), ("transformer", "tiny"), ("vit", "tiny")]


@pytest.mark.parametrize("file,preset", FAMILIES)
def test_family_jit_forward_and_gradient(experiment, file, preset):
  c = ModelConfig.from_dict(experiment(file, preset).model)
  inputs = example_inputs(c, batch=2, length=16)
  if c.family == "vit":
    inputs = (jax.random.uniform(KEY, inputs[0].shape),)
  else:
    inputs = tuple(tokens(i, x.shape, c.vocab_size) for i, x in enumerate(inputs))
  model = build_model(c)
  params = init(c, *inputs)

  @jax.jit  # the forward and its gradient as one program
  def loss_and_grad(p):
    def loss(p):
      out = model.apply({"params": p}, *inputs)
      return jnp.mean(jnp.square(out["logits"])), out

    return jax.value_and_grad(loss, has_aux=True)(p)

  (value, out), grads = loss_and_grad(params)
  B = 2
  if c.family == "vit":
    assert out["logits"].shape == (B, c.num_classes)
    assert out["hidden"].shape == (B, c.num_patches + 1, c.d_model)
  else:
    T = inputs[-1].shape[1]
    assert out["logits"].shape == (B, T, c.vocab_size)
    assert out["hidden"].shape == (B, T, c.d_model)
  assert out["logits"].dtype == jnp.float32
  assert np.isfinite(float(value))
  leaves = jax.tree_util.tree_leaves(grads)
  assert all(np.all(np.isfinite(g)) for g in leaves)
  assert sum(float(jnp.sum(jnp.abs(g))) for g in leaves) > 0


# ------------------------------------------------------------------ causality and positions
def test_decoder_is_causal_encoder_is_not():
  x = tokens()
  y = x.at[:, 7:].set((x[:, 7:] + 1) % 50)
  for family, causal in (("decoder", True), ("encoder", False)):
    c = ModelConfig(family=family, head="mlm" if family == "encoder" else "", **SMALL)
    p = init(c, x)
    a, b = forward(c, p, x)["logits"], forward(c, p, y)["logits"]
    early = np.abs(np.asarray(a[:, :7] - b[:, :7])).max()
    assert (early == 0.0) if causal else (early > 1e-4), (family, early)
    assert np.abs(np.asarray(a[:, 7:] - b[:, 7:])).max() > 1e-4


def test_encoder_decoder_target_is_causal_source_is_not():
  c = ModelConfig(family="encoder_decoder", positions="sinusoidal", **SMALL)
  src, tgt = tokens(1), tokens(2)
  p = init(c, src, tgt)
  base = forward(c, p, src, tgt)["logits"]
  later_tgt = forward(c, p, src, tgt.at[:, 7:].set((tgt[:, 7:] + 1) % 50))["logits"]
  later_src = forward(c, p, src.at[:, 11:].set((src[:, 11:] + 1) % 50), tgt)["logits"]
  assert np.abs(np.asarray(base[:, :7] - later_tgt[:, :7])).max() == 0.0
  assert np.abs(np.asarray(base[:, :3] - later_src[:, :3])).max() > 1e-6


@pytest.mark.parametrize("positions", ["none", "learned", "sinusoidal", "rope"])
def test_dog_bites_man_permutation(positions):
  """Without positions (and no causal mask) permuting tokens permutes the outputs; with any
  positional encoding it does not."""
  c = ModelConfig(family="encoder", head="mlm", positions=positions, **SMALL)
  x = tokens()
  perm = np.random.default_rng(0).permutation(x.shape[1])
  p = init(c, x)
  a = np.asarray(forward(c, p, x)["hidden"])
  b = np.asarray(forward(c, p, x[:, perm])["hidden"])
  gap = np.abs(a[:, perm] - b).max()
  if positions == "none":
    assert gap < 1e-5
  else:
    assert gap > 1e-3


def test_rope_scores_depend_only_on_offset():
  q = jax.random.normal(KEY, (1, 1, 1, 16))
  k = jax.random.normal(jax.random.PRNGKey(1), (1, 1, 1, 16))

  def score(m, n):
    qm = apply_rope(q, jnp.array([[m]]), 10000.0)
    kn = apply_rope(k, jnp.array([[n]]), 10000.0)
    return float(jnp.sum(qm * kn))

  for offset in (0, 1, 5, 37):
    scores = [score(m + offset, m) for m in (0, 3, 100, 1000)]
    assert np.allclose(scores, scores[0], rtol=1e-4, atol=1e-4), (offset, scores)
  assert abs(score(5, 0) - score(0, 0)) > 1e-3  # but it does depend on the offset


def test_sinusoidal_matches_formula_and_falls_with_distance():
  table = sinusoidal_table(64, 16)
  for pos in (0, 1, 5, 10, 63):
    np.testing.assert_allclose(table[pos], lesson_positional_encoding(pos, 16), atol=1e-6)
  dots = [float(table[10] @ table[10 + gap]) for gap in (0, 1, 2, 4, 8, 16)]
  assert all(a > b for a, b in zip(dots, dots[1:])), dots
  assert dots[0] == pytest.approx(8.0, abs=1e-5)  # d/2 pairs of sin^2 + cos^2


# ------------------------------------------------------------------ scan, GQA, MoE, remat, cache
@pytest.mark.parametrize(
    "family,extra",
    [
        ("decoder", {}),
        ("encoder_decoder", dict(positions="sinusoidal")),
        ("decoder", dict(feed_forward="moe", num_experts=4, top_k=2, positions="rope")),
    ],
)
def test_scanned_equals_looped(family, extra):
  c = ModelConfig(family=family, scan_layers=True, **SMALL, **extra)
  inputs = (tokens(1),) * (2 if family == "encoder_decoder" else 1)
  scanned = init(c, *inputs)
  assert "layers" in scanned["decoder"]
  looped = scan_to_loop(scanned)
  assert "layer_1" in looped["decoder"] and "layers" not in looped["decoder"]
  a = forward(c, scanned, *inputs)["logits"]
  b = forward(c.replace(scan_layers=False), looped, *inputs)["logits"]
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  back = loop_to_scan(looped)
  for x, y in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(scanned)):
    np.testing.assert_array_equal(x, y)


def test_scan_adds_layers_logical_axis():
  c = ModelConfig(scan_layers=True, **SMALL)
  # the names are metadata of the boxed parameters: shapes alone carry them (nothing compiles)
  boxed = jax.eval_shape(build_model(c).init, KEY, tokens())["params"]
  kernel = boxed["decoder"]["layers"]["self_attn"]["query"]["kernel"]
  assert kernel.names == ("layers", "embed", "heads", "head_dim")
  wo = boxed["decoder"]["layers"]["ffn"]["wo"]["kernel"]
  assert wo.names == ("layers", "mlp", "embed")


def test_gqa_equals_mha_with_repeated_kv_heads():
  """GQA (4 query heads, 2 kv heads) == MHA whose k/v weights repeat each kv head per group."""
  gqa = ModelConfig(num_kv_heads=2, **SMALL)
  mha = gqa.replace(num_kv_heads=None)
  x = tokens()
  p = init(gqa, x)
  q = jax.tree_util.tree_map(lambda a: a, p)
  for layer in ("layer_0", "layer_1"):
    attn = q["decoder"][layer]["self_attn"]
    for name in ("key", "value"):
      attn[name] = {
          "kernel": jnp.repeat(attn[name]["kernel"], 2, axis=1),
          "bias": jnp.repeat(attn[name]["bias"], 2, axis=0),
      }
  a = forward(gqa, p, x)["logits"]
  b = forward(mha, q, x)["logits"]
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  # kv_heads == heads is plain MHA: same parameters, same outputs
  same = ModelConfig(num_kv_heads=4, **SMALL)
  np.testing.assert_array_equal(
      forward(same, init(mha, x), x)["logits"], forward(mha, init(mha, x), x)["logits"]
  )


def test_attention_dropout_path_matches_fused_path_without_dropout():
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 6, 4, 8)) for i in range(3))
  mask = jnp.ones((2, 1, 1, 6), bool).at[1, :, :, 4:].set(False)
  fused = attend(q, k[:, :, :2], v[:, :, :2], mask, True, impl="fused")
  explicit = attend(q, k[:, :, :2], v[:, :, :2], mask, True, dropout_fn=lambda w: w)
  np.testing.assert_allclose(np.asarray(fused), np.asarray(explicit), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "T,S,heads,groups,causal,mask_shape",
    [
        (256, 256, 4, 4, True, (2, 1, 1, 256)),  # four query blocks, padding mask over keys
        (200, 200, 4, 2, True, None),  # GQA, three uneven blocks
        (130, 130, 2, 1, True, (2, 1, 130, 130)),  # MQA, a full [B, 1, T, S] mask, two blocks
        (96, 160, 4, 4, False, (2, 4, 96, 160)),  # cross-attention shape, per-head mask
    ],
)
def test_einsum_attention_equals_jax_dot_product_attention(T, S, heads, groups, causal, mask_shape):
  """The written-out path (causal query blocks that skip their masked keys) gives the outputs
  and gradients of jax.nn.dot_product_attention."""
  keys = jax.random.split(KEY, 5)
  q = jax.random.normal(keys[0], (2, T, heads, 16))
  k, v = (jax.random.normal(kk, (2, S, groups, 16)) for kk in keys[1:3])
  mask = None
  if mask_shape is not None:
    mask = jax.random.uniform(keys[3], mask_shape) > 0.3
    mask = mask.at[..., 0].set(True)  # every query keeps a key
  cot = jax.random.normal(keys[4], (2, T, heads, 16))

  @functools.partial(jax.jit, static_argnames="impl")  # one program per path, not op by op
  def run(q, k, v, mask, cot, impl):
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, mask, causal, impl=impl), q, k, v)
    return (out, *vjp(cot))

  for a, b in zip(run(q, k, v, mask, cot, impl="einsum"), run(q, k, v, mask, cot, impl="fused")):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


def test_fused_projections_hold_dense_parameters_and_outputs():
  """DenseWeights + fused_dense: the parameter paths, shapes, initial values and outputs of one
  nn.DenseGeneral per projection (checkpoints and HF conversion see no difference)."""
  from transformers_jax.modules.common import DenseWeights, dense, fused_dense

  c = ModelConfig(**SMALL)
  names = (("embed", "heads", "head_dim"), ("heads", "head_dim"))

  class Separate(nn.Module):

    @nn.compact
    def __call__(self, x):
      return [dense(c, (4, 8), -1, *names, n)(x) for n in ("query", "key", "value")]

  class Fused(nn.Module):

    @nn.compact
    def __call__(self, x):
      ws = [DenseWeights(c, (4, 8), *names, name=n)(x.shape[-1]) for n in ("query", "key", "value")]
      return fused_dense(c, x, ws)

  x = jax.random.normal(KEY, (2, 5, 32))
  p_sep, p_fused = Separate().init(KEY, x), Fused().init(KEY, x)
  assert jax.tree_util.tree_structure(p_sep) == jax.tree_util.tree_structure(p_fused)
  jax.tree_util.tree_map(np.testing.assert_array_equal, nn.unbox(p_sep), nn.unbox(p_fused))
  assert nn.get_partition_spec(p_sep) == nn.get_partition_spec(p_fused)
  p = jax.tree_util.tree_map(lambda a: a + jax.random.normal(KEY, a.shape), nn.unbox(p_sep))
  for a, b in zip(Separate().apply(p, x), Fused().apply(p, x)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_moe_routes_each_token_to_top_k_experts():
  probs = jax.nn.softmax(jax.random.normal(KEY, (2, 10, 4)), -1)
  combine, dispatch, _ = route(probs, top_k=2, capacity=20)  # room for every choice
  experts_per_token = np.asarray((combine > 0).any(-1).sum(-1))
  assert (experts_per_token == 2).all()
  np.testing.assert_allclose(np.asarray(combine.sum((-1, -2))), 1.0, rtol=1e-5)
  top2 = np.argsort(-np.asarray(probs), -1)[..., :2]
  chosen = np.asarray((combine > 0).any(-1))
  for b in range(2):
    for t in range(10):
      assert set(np.flatnonzero(chosen[b, t])) == set(top2[b, t])
  # a tight capacity drops choices instead of overfilling an expert
  _, tight, _ = route(probs, top_k=2, capacity=3)
  assert np.asarray(tight.sum(1)).max() <= 3  # no expert slot over capacity
  assert np.asarray(tight.sum(-1)).max() <= 1  # a slot holds at most one token


def test_moe_block_sows_aux_loss_and_counts():
  c = ModelConfig(feed_forward="moe", num_experts=4, top_k=1, **SMALL)
  x = tokens()
  model = build_model(c)
  params = jax.jit(model.init)(KEY, x)["params"]  # one program, not one per operation
  apply = lambda p: model.apply({"params": p}, x, mutable=["losses", "intermediates"])  # noqa: E731
  out, state = jax.jit(apply)(params)
  aux = jax.tree_util.tree_leaves(state["losses"])
  assert len(aux) == 2  # one per layer
  assert all(0.99 <= float(a) <= 4.0 for a in aux)  # 1 = balanced, E = all on one expert
  rms = jax.tree_util.tree_leaves(state["intermediates"]["decoder"])
  assert len([r for r in rms if r.ndim == 0]) >= 2
  # what evaluation reports: the share of routing choices over capacity, averaged over layers
  from transformers_jax.train.step import moe_dropped_fraction

  dropped = moe_dropped_fraction(state["intermediates"])
  assert 0.0 <= dropped < 1.0
  assert moe_dropped_fraction({"decoder": {"layer_0": {"residual_rms": jnp.ones(())}}}) is None


def test_remat_gives_the_same_gradients():
  c = ModelConfig(**SMALL)
  x = tokens()
  p = init(c, x)

  @functools.partial(jax.jit, static_argnums=0)
  def grads(cfg, p):
    model = build_model(cfg)
    return jax.grad(lambda p: jnp.sum(model.apply({"params": p}, x)["logits"] ** 2))(p)

  for policy in ("full", "dots_saveable"):
    for a, b in zip(
        jax.tree_util.tree_leaves(grads(c, p)),
        jax.tree_util.tree_leaves(grads(c.replace(remat=policy), p)),
    ):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("positions,kv", [("learned", None), ("rope", 2)])
def test_kv_cache_prefill_then_steps_equals_full_forward(positions, kv):
  c = ModelConfig(positions=positions, num_kv_heads=kv, **SMALL)
  x = tokens(shape=(2, 10))
  p = init(c, x)
  full = forward(c, p, x)["logits"]
  model = build_model(c, decode=True)
  # as many cache slots as the init input has tokens (jitted: one program, not one per operation)
  cache = jax.jit(model.init)(KEY, x)["cache"]
  assert cache["decoder"]["layer_0"]["self_attn"]["cached_key"].shape == (2, c.kv_heads, 10, 8)
  apply = jax.jit(lambda cache, x: model.apply({"params": p, "cache": cache}, x, mutable=["cache"]))
  out, state = apply(cache, x[:, :6])
  logits = [out["logits"]]
  for t in range(6, 10):
    out, state = apply(state["cache"], x[:, t : t + 1])
    logits.append(out["logits"])
  np.testing.assert_allclose(
      np.asarray(jnp.concatenate(logits, 1)), np.asarray(full), rtol=1e-4, atol=1e-4
  )


def test_dropout_only_when_not_deterministic():
  c = ModelConfig(dropout=0.5, attention_dropout=0.5, **SMALL)
  x = tokens()
  p = init(c, x)
  a = forward(c, p, x)["logits"]
  np.testing.assert_array_equal(a, forward(c, p, x)["logits"])
  train = build_model(c, deterministic=False)
  dropped = jax.jit(lambda p, r: train.apply({"params": p}, x, rngs={"dropout": r})["logits"])
  b = dropped(p, jax.random.PRNGKey(3))
  assert np.abs(np.asarray(a - b)).max() > 1e-3


# ------------------------------------------------------------------ norm placement
def block_params(c):
  x = jax.random.normal(KEY, (2, 5, c.d_model)) * 3 + 1
  block = Block(c)
  params = nn.unbox(block.init(KEY, x)["params"])
  return block, params, x


@pytest.mark.parametrize(
    "placement,norms",
    [
        ("pre", {"self_attn_norm", "ffn_norm"}),
        ("post", {"self_attn_norm", "ffn_norm"}),
        ("sandwich", {"self_attn_norm_in", "self_attn_norm_out", "ffn_norm_in", "ffn_norm_out"}),
        ("none", set()),
    ],
)
def test_norm_placement_structure(placement, norms):
  c = ModelConfig(norm_placement=placement, **SMALL)
  block, params, x = block_params(c)
  assert {k for k in params if "norm" in k} == norms
  y = np.asarray(block.apply({"params": params}, x))
  normalised = np.allclose(y.mean(-1), 0, atol=1e-4) and np.allclose(y.std(-1), 1, atol=1e-2)
  # post-norm leaves a normalised stream; the others leave the residual stream unnormalised
  assert normalised == (placement == "post")
  if placement == "pre":  # x + f(norm(x)): the sublayers only ever see normalised inputs
    zero_attn = jax.tree_util.tree_map(jnp.zeros_like, params)
    zero_attn = {**params, "self_attn": zero_attn["self_attn"], "ffn": zero_attn["ffn"]}
    np.testing.assert_allclose(block.apply({"params": zero_attn}, x), x, atol=1e-6)


def test_residual_off_drops_the_skip_path():
  c = ModelConfig(norm_placement="pre", **SMALL)
  block, params, x = block_params(c)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  no_residual = Block(c.replace(residual=False))
  # with every weight zero, a residual block is the identity and a residual-free block is zero
  np.testing.assert_allclose(block.apply({"params": zeros}, x), x, atol=1e-6)
  np.testing.assert_allclose(no_residual.apply({"params": zeros}, x), 0.0, atol=1e-6)


def test_rmsnorm_without_bias_and_knobs_on_any_family():
  c = ModelConfig(
      family="vit",
      image_size=8,
      patch_size=4,
      num_channels=1,
      num_classes=3,
      norm="rmsnorm",
      norm_placement="post",
      positions="rope",
      activation="swiglu",
      num_kv_heads=2,
      num_layers=2,
      d_model=32,
      num_heads=4,
  )
  x = jax.random.uniform(KEY, (2, 8, 8, 1))
  p = init(c, x)
  norm = p["encoder"]["layer_0"]["ffn_norm"]
  assert set(norm) == {"scale"}  # rmsnorm defaults to no bias
  assert forward(c, p, x)["logits"].shape == (2, 3)


# ------------------------------------------------------------------ bad configs
@pytest.mark.parametrize(
    "fields,named",
    [
        (dict(d_model=30, num_heads=4), "model.num_heads"),
        (dict(num_heads=4, num_kv_heads=3), "model.num_kv_heads"),
        (dict(family="vit", image_size=30, patch_size=16, num_classes=2), "model.image_size"),
        (dict(positions="rope", d_model=20, num_heads=4), "model.head_dim"),
        (dict(norm_placement="middle"), "model.norm_placement"),
        (dict(activation="tanh"), "model.activation"),
        (dict(family="gpt"), "model.family"),
        (dict(feed_forward="moe", num_experts=2, top_k=3), "model.top_k"),
        (dict(family="encoder", head="classifier"), "model.num_classes"),
        (dict(family="decoder", head="pooler"), "model.head"),
        (dict(dropout=1.5), "model.dropout"),
    ],
)
def test_bad_configs_raise_value_error_naming_the_field(fields, named):
  with pytest.raises(ValueError, match=named.replace(".", r"\.")):
    ModelConfig(**fields)


def test_unknown_field_is_named():
  with pytest.raises(ValueError, match=r"model\.num_layer\b"):
    ModelConfig.from_dict({"num_layer": 3})


def test_sequence_longer_than_max_len_is_refused():
  c = ModelConfig(**SMALL)
  with pytest.raises(ValueError, match="max_len"):
    build_model(c).init(KEY, jnp.zeros((1, 17), jnp.int32))
