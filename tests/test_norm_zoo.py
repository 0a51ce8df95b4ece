"""Every norm placement (modules/placements/) on every family, and each paper's formula.

The parametrisations read the registry: a new placement is covered by these tests without new
test code (test_a_new_placement_is_one_registry_entry shows it)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.models import counting
from transformers_jax.config import FAMILIES
from transformers_jax.interop.common import UnsupportedConfig
from transformers_jax.interop.hf_export import save_hf
from transformers_jax.models import build_model, initializer
from transformers_jax.modules import inits as inits_lib
from transformers_jax.modules import placements as placements_lib
from transformers_jax.modules.attention import Attention
from transformers_jax.modules.block import Block
from transformers_jax.modules.feed_forward import FeedForward
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.placement_base import Depth, Placement

from conftest import load_script

BUILT = [name for name, p in placements_lib.PLACEMENTS.items() if not p.unavailable]
KEY = jax.random.PRNGKey(0)
X = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 8))  # one block's input [B, T, D]

# the tiny models and their loss are the grid script's (scripts/norm_zoo_grid.py runs every
# placement x family x layout; these tests run a rotation of it)
_grid = load_script("norm_zoo_grid")
tiny, loss_fn = _grid.tiny_config, _grid.loss_of


LAYOUTS = [(family, False) for family in FAMILIES] + [("decoder", True)]


@pytest.mark.parametrize(
    "family,scan", LAYOUTS, ids=[f + ("-scanned" if s else "") for f, s in LAYOUTS]
)
@pytest.mark.parametrize("placement", BUILT)
def test_every_placement_builds_on_every_family_and_counts_derive_from_it(placement, family, scan):
  """Looped stacks of every family and a scanned one (a scanned stack holds the same
  parameters, stacked; every family trains scanned with some placement below)."""
  c = tiny(family, placement, scan)
  shapes = nn.unbox(jax.eval_shape(initializer(c), KEY))
  model_count = sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))
  assert counting.analytic_count(c) == model_count
  assert counting.tree_breakdown(shapes, c) == counting.analytic_breakdown(c)


@pytest.mark.parametrize("placement", BUILT)
def test_every_placement_trains_five_steps(placement):
  """Five SGD steps of one family and layout per placement, in turn over the placements, so
  that every family and both layouts train (the build of every combination is the test above;
  scanned against looped blocks, test_a_traced_block_index_equals_a_static_one)."""
  i = BUILT.index(placement)
  family, scan = FAMILIES[i % len(FAMILIES)], bool((i // len(FAMILIES)) % 2)
  c = tiny(family, placement, scan, num_layers=2 if scan else 1)
  losses = _grid.train_steps(c, 5)
  assert np.all(np.isfinite(losses)), losses
  assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("placement", BUILT)
def test_a_traced_block_index_equals_a_static_one(placement):
  """Under nn.scan a block's index is a traced input, in a looped stack a Python int: the
  placement wires both alike (the stacking of parameters is placement-independent and tested
  with the model)."""
  c = tiny("decoder", placement, num_layers=4)
  traced = Block(c, causal=True, num_layers=4)
  traced_apply = jax.jit(lambda p, i: traced.apply(p, X, layer=i))  # one compile for both
  for layer in (0, 3):
    static = Block(c, causal=True, layer=layer, num_layers=4)
    params = static.init(KEY, X)
    got = traced_apply(params, layer)
    np.testing.assert_allclose(got, static.apply(params, X), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- the formulas


def layernorm(x, p, eps=1e-5):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def one_block(placement, layer=0, num_layers=4, role="single", features=(), **overrides):
  """(block output, params, attention f, feed-forward f) of one Block at X."""
  c = tiny("encoder", placement, num_layers=num_layers, head="pooler", **overrides)
  block = Block(c, layer=layer, num_layers=num_layers, role=role)
  params = block.init(KEY, X)["params"]
  params = nn.unbox(params)
  params = jax.tree_util.tree_map_with_path(
      lambda path, v: v + 0.3 if str(path[-1].key).endswith("_gain") else v, params
  )  # gains away from their initial values, so that their formula shows
  out = block.apply({"params": params}, X)
  attn = lambda h: Attention(c, features=features).apply({"params": params["self_attn"]}, h)
  ffn = lambda h: FeedForward(c, features=features).apply({"params": params["ffn"]}, h)
  return out, params, attn, ffn


FORMULAS = {
    "pre": lambda x, p, a, f, depth: (lambda y: y + f(layernorm(y, p["ffn_norm"])))(
        x + a(layernorm(x, p["self_attn_norm"]))
    ),
    "post": lambda x, p, a, f, depth: (lambda y: layernorm(y + f(y), p["ffn_norm"]))(
        layernorm(x + a(x), p["self_attn_norm"])
    ),
    "sandwich": lambda x, p, a, f, depth: (
        lambda y: y + layernorm(f(layernorm(y, p["ffn_norm_in"])), p["ffn_norm_out"])
    )(x + layernorm(a(layernorm(x, p["self_attn_norm_in"])), p["self_attn_norm_out"])),
    "none": lambda x, p, a, f, depth: (lambda y: y + f(y))(x + a(x)),
    # ReZero: one alpha per block, shared by its sublayers (the authors' `resweight`)
    "rezero": lambda x, p, a, f, depth: (lambda y: y + p["branch_gain"] * f(y))(
        x + p["branch_gain"] * a(x)
    ),
    "rezero_sublayer": lambda x, p, a, f, depth: (lambda y: y + p["ffn_branch_gain"] * f(y))(
        x + p["self_attn_branch_gain"] * a(x)
    ),
    # Peri-LN's block is the sandwich (its embedding norm: test_peri_ln_normalises_embeddings)
    "peri": lambda x, p, a, f, depth: (
        lambda y: y + layernorm(f(layernorm(y, p["ffn_norm_in"])), p["ffn_norm_out"])
    )(x + layernorm(a(layernorm(x, p["self_attn_norm_in"])), p["self_attn_norm_out"])),
    "layerscale": lambda x, p, a, f, depth: (
        lambda y: y + p["ffn_branch_gain"] * f(layernorm(y, p["ffn_norm"]))
    )(x + p["self_attn_branch_gain"] * a(layernorm(x, p["self_attn_norm"]))),
    "admin": lambda x, p, a, f, depth: (
        lambda y: layernorm(p["ffn_skip_gain"] * y + f(y), p["ffn_norm"])
    )(layernorm(p["self_attn_skip_gain"] * x + a(x), p["self_attn_norm"])),
    "reordered": lambda x, p, a, f, depth: (lambda y: y + layernorm(f(y), p["ffn_norm"]))(
        x + layernorm(a(x), p["self_attn_norm"])
    ),
    "b2t": lambda x, p, a, f, depth: (lambda h: layernorm(h + f(h) + x, p["ffn_norm"]))(
        layernorm(x + a(x), p["self_attn_norm"])
    ),
    "scaled": lambda x, p, a, f, depth: (
        lambda y: y + f(layernorm(y, p["ffn_norm"]) / math.sqrt(depth + 1))
    )(x + a(layernorm(x, p["self_attn_norm"]) / math.sqrt(depth + 1))),
    "parallel": lambda x, p, a, f, depth: (lambda h: x + a(h) + f(h))(
        layernorm(x, p["input_norm"])
    ),
}


@pytest.mark.parametrize("layer", [0, 3])
@pytest.mark.parametrize("placement", sorted(FORMULAS))
def test_block_equals_the_papers_formula(placement, layer):
  out, p, attn, ffn = one_block(placement, layer=layer)
  want = FORMULAS[placement](X, p, attn, ffn, layer)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layer,post", [(0, True), (1, False), (3, False)])
def test_mixln_is_post_ln_in_the_first_quarter_of_blocks_and_pre_ln_after(layer, post):
  out, p, attn, ffn = one_block("mixln", layer=layer, num_layers=4)
  want = FORMULAS["post" if post else "pre"](X, p, attn, ffn, layer)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "role,n,m,alpha,beta",
    [
        ("single", 4, 0, (2 * 4) ** 0.25, (8 * 4) ** -0.25),
        ("encoder", 6, 3, 0.81 * (6**4 * 3) ** (1 / 16), 0.87 * (6**4 * 3) ** (-1 / 16)),
        ("decoder", 3, 6, (3 * 3) ** 0.25, (12 * 3) ** -0.25),
    ],
)
def test_deepnorm_alpha_beta_and_init_gains(role, n, m, alpha, beta):
  """DeepNet's Table 1 constants, the block N(alpha x + f(x)), and Xavier normal init with gain
  beta on value/out/FFN and 1 on query/key."""
  depth = Depth(0, n, role, m)
  assert placements_lib.deepnet_constants(depth) == pytest.approx((alpha, beta), rel=1e-12)
  out, p, attn, ffn = one_block("deepnorm", num_layers=n, role=role, num_encoder_layers=None)
  if role == "single":
    y = layernorm(alpha * X + attn(X), p["self_attn_norm"])
    np.testing.assert_allclose(out, layernorm(alpha * y + ffn(y), p["ffn_norm"]), atol=1e-6)
  wide = tiny("decoder", "deepnorm", num_layers=n, d_model=128, num_heads=2, d_ff=512)
  block = Block(wide, layer=0, num_layers=n, role=role)
  params = nn.unbox(block.init(KEY, jnp.zeros((1, 2, 128)))["params"])
  xavier_std = lambda fan_in, fan_out, gain: gain * math.sqrt(2 / (fan_in + fan_out))
  for path, fans, gain in [
      (("self_attn", "query", "kernel"), (128, 128), 1.0),
      (("self_attn", "key", "kernel"), (128, 128), 1.0),
      (("self_attn", "value", "kernel"), (128, 128), beta),
      (("self_attn", "out", "kernel"), (128, 128), beta),
      (("ffn", "wi", "kernel"), (128, 512), beta),
      (("ffn", "wo", "kernel"), (512, 128), beta),
  ]:
    kernel = params
    for k in path:
      kernel = kernel[k]
    assert float(np.std(kernel)) == pytest.approx(xavier_std(*fans, gain), rel=0.05), path


@pytest.mark.parametrize("family,scan", [("decoder", False), ("encoder_decoder", True)])
def test_admin_omega_is_the_root_of_the_branch_variances_before_it(family, scan):
  c = tiny(family, "admin", scan, num_layers=3)
  init = initializer(c)  # scanned blocks compile one program rather than each nn.scan op by op
  params = nn.unbox(jax.jit(init)(KEY) if scan else init(KEY))
  unprofiled = jax.tree_util.tree_map_with_path(
      lambda path, v: jnp.ones_like(v) if str(path[-1].key).endswith("_gain") else v, params
  )
  from transformers_jax.models import profile_inputs

  probe = profile_inputs(c, jax.random.fold_in(KEY, 1))
  _, sown = build_model(c).apply({"params": unprofiled}, *probe, mutable=["profile"])
  subs = ("self_attn", "cross_attn", "ffn") if family == "encoder_decoder" else ("self_attn", "ffn")
  stack = "decoder"  # the last stack: in an encoder-decoder, its own sum starts again
  block = lambda tree, i: tree["layers"] if scan else tree[f"layer_{i}"]
  pick = lambda value, i: value[i] if scan else value
  total = float(sown["profile"][stack]["input_var"][0])
  for i in range(3):
    for sub in subs:
      omega = pick(block(params[stack], i)[f"{sub}_skip_gain"], i)
      np.testing.assert_allclose(omega, np.full(c.d_model, math.sqrt(total)), rtol=1e-5)
      total += float(pick(block(sown["profile"][stack], i)[f"{sub}_branch_var"][0], i))


def reference_attention(x, p, c, qkv_norm=False, head_gain=False, out_norm=False):
  """Bidirectional multi-head attention written out, with the placements' inner options."""
  H, K = c.num_heads, c.head_width
  q, k, v = (jnp.einsum("btd,dhk->bthk", x, p[n]["kernel"]) + p[n]["bias"] for n in "qkv")
  if qkv_norm:
    flat = lambda a, n: layernorm(a.reshape(*a.shape[:2], H * K), p[n]).reshape(a.shape)
    q, k, v = flat(q, "query_proj_norm"), flat(k, "key_proj_norm"), flat(v, "value_proj_norm")
  w = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(K), axis=-1)
  o = jnp.einsum("bhqs,bshk->bqhk", w, v)
  if head_gain:
    o = o * p["head_gain"][:, None]
  if out_norm:
    o = layernorm(o.reshape(*o.shape[:2], H * K), p["heads_out_norm"]).reshape(o.shape)
  return jnp.einsum("bthk,hkd->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def reference_ffn(x, p, mid_norm=False):
  h = jax.nn.gelu(x @ p["wi"]["kernel"] + p["wi"]["bias"], approximate=False)
  if mid_norm:
    h = layernorm(h, p["mid_norm"])
  return h @ p["wo"]["kernel"] + p["wo"]["bias"]


def test_normformer_hybrid_and_subln_inner_norms_equal_their_formulas():
  renamed = lambda p: {**p, **{"q": p["query"], "k": p["key"], "v": p["value"]}}
  out, p, _, _ = one_block("normformer")
  c = tiny("encoder", "normformer", head="pooler")
  a = lambda h: reference_attention(h, renamed(p["self_attn"]), c, head_gain=True)
  y = X + layernorm(a(layernorm(X, p["self_attn_norm"])), p["self_attn_norm_out"])
  want = y + reference_ffn(layernorm(y, p["ffn_norm"]), p["ffn"], mid_norm=True)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)

  # HybridNorm (Zhuo et al. 2025): Y = X + MHA(QKV-Norm(X)); X' = N(Y) + FFN(N(Y)), the
  # authors' released configuration (ffn_residual_after_norm); it was N(Y + FFN(Y)) before
  out, p, _, _ = one_block("hybrid")
  y = X + reference_attention(X, renamed(p["self_attn"]), c, qkv_norm=True)
  h = layernorm(y, p["ffn_norm"])
  np.testing.assert_allclose(out, h + reference_ffn(h, p["ffn"]), atol=1e-6)
  assert placements_lib.PLACEMENTS["hybrid"].final_norm  # the base model's final norm kept

  out, p, _, _ = one_block("subln")
  a = lambda h: reference_attention(h, renamed(p["self_attn"]), c, out_norm=True)
  y = X + a(layernorm(X, p["self_attn_norm"]))
  want = y + reference_ffn(layernorm(y, p["ffn_norm"]), p["ffn"], mid_norm=True)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
  gamma = math.sqrt(math.log(2 * 4))  # Magneto's gain for a 4-block decoder-only/encoder-only
  assert placements_lib.magneto_gain(Depth(0, 4)) == pytest.approx(gamma)


def test_tfixup_and_rezero_and_layerscale_initial_values():
  assert placements_lib.tfixup_scale(tiny("decoder", "tfixup"), Depth(0, 6)) == pytest.approx(
      (9 * 6) ** -0.25
  )
  assert placements_lib.tfixup_scale(
      tiny("encoder_decoder", "tfixup"), Depth(0, 6, "encoder", 6)
  ) == pytest.approx(0.67 * 6**-0.25)
  params = nn.unbox(initializer(tiny("decoder", "rezero_sublayer"))(KEY))
  assert float(params["decoder"]["layer_0"]["ffn_branch_gain"]) == 0.0
  params = nn.unbox(initializer(tiny("decoder", "rezero"))(KEY))
  assert float(params["decoder"]["layer_0"]["branch_gain"]) == 0.0
  deep = Block(tiny("decoder", "layerscale", num_layers=20), layer=0, num_layers=20)
  params = nn.unbox(deep.init(KEY, X)["params"])  # the first of 20 blocks, not all 20
  np.testing.assert_array_equal(params["ffn_branch_gain"], np.float32(1e-5))
  assert [placements_lib.cait_epsilon(n) for n in (12, 24, 36)] == [0.1, 1e-5, 1e-6]


@pytest.mark.parametrize("kind", ["dyt", "scalenorm"])
def test_new_norm_kinds_equal_their_formulas(kind):
  c = tiny("decoder", "pre", norm=kind)
  norm = Norm(c)
  params = nn.unbox(norm.init(KEY, X)["params"])
  params = jax.tree_util.tree_map(lambda v: v + 0.25, params)  # away from the initial values
  out = norm.apply({"params": params}, X)
  if kind == "dyt":  # gamma * tanh(alpha x) + beta
    want = params["scale"] * jnp.tanh(params["alpha"] * X) + params["bias"]
  else:  # g x / ||x||
    want = params["scale"] * X / jnp.sqrt(jnp.sum(X**2, -1, keepdims=True) + c.norm_eps)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
  assert counting.analytic_count(c) == sum(
      math.prod(s.shape)
      for s in jax.tree_util.tree_leaves(nn.unbox(jax.eval_shape(initializer(c), KEY)))
  )


class HalfResidual(Placement):
  """x + f(N(x)) / 2: a placement written in a test, to show what adding one takes."""

  final_norm = True

  def sublayer(self, site, x, name, fn):
    return site.add(x, 0.5 * site.dropout(fn(site.norm(f"{name}_norm")(x))))


def test_a_new_placement_is_one_registry_entry(monkeypatch):
  monkeypatch.setitem(placements_lib.PLACEMENTS, "half", HalfResidual())
  c = tiny("decoder", "half", num_layers=1)
  assert c.has_final_norm
  params = nn.unbox(initializer(c)(KEY))
  assert np.isfinite(float(loss_fn(c)(params)))
  shapes = jax.eval_shape(initializer(c), KEY)
  assert counting.analytic_count(c) == sum(
      math.prod(s.shape) for s in jax.tree_util.tree_leaves(nn.unbox(shapes))
  )


def test_placement_config_mistakes_are_one_line():
  with pytest.raises(ValueError, match="model.feed_forward='moe': nGPT's MLP scales"):
    tiny("decoder", "ngpt", feed_forward="moe")
  with pytest.raises(ValueError, match="norm_placement_arg=0.5: norm_placement=pre takes no"):
    tiny("decoder", "pre", norm_placement_arg=0.5)
  with pytest.raises(ValueError, match="mixln's alpha must be in"):
    tiny("decoder", "mixln", norm_placement_arg=1.5)
  with pytest.raises(ValueError, match="model.moe_impl='ragged'.*use model.moe_impl=dense"):
    tiny("decoder", "normformer", feed_forward="moe", moe_impl="ragged", num_experts=2)


@pytest.mark.parametrize("placement", ["deepnorm", "rezero", "parallel"])
def test_hugging_face_export_refuses_a_placement_gpt2_cannot_express(placement, tmp_path):
  c = tiny("decoder", placement)
  params = jax.eval_shape(initializer(c), KEY)
  with pytest.raises(UnsupportedConfig, match=f"model.norm_placement='{placement}'"):
    save_hf(tmp_path, c, params)
  assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- initialisations
@pytest.mark.parametrize("init", sorted(inits_lib.INITS))
@pytest.mark.parametrize("placement", ["pre", "post", "hybrid"])
def test_every_initialisation_draws_what_its_entry_says(init, placement):
  """Each `model.init` entry's standard deviations, measured on the drawn weights of a
  64-wide, 2-block decoder: gpt2 init_std everywhere; xavier sqrt(2 / (fan_in + fan_out))
  and embeddings d^-1/2; megatron init_std / sqrt(2L) on the output projections; paper the
  placement's own entry's."""
  c = tiny("decoder", placement, num_layers=2, d_model=64, d_ff=128, vocab_size=512, init=init)
  params = nn.unbox(jax.jit(initializer(c))(KEY))
  block, embed = params["decoder"]["layer_1"], params["embed"]["token_embed"]["embedding"]
  name = placements_lib.PLACEMENTS[placement].paper_init if init == "paper" else init
  std_of = lambda w: float(np.std(np.asarray(w)))
  wi, out = block["ffn"]["wi"]["kernel"], block["self_attn"]["out"]["kernel"]
  want = {
      "gpt2": (0.02, 0.02, 0.02),
      "xavier": (math.sqrt(2 / (64 + 128)), math.sqrt(2 / (64 + 64)), 64**-0.5),
      "megatron": (0.02, 0.02 / math.sqrt(2 * c.num_layers), 0.02),
  }[name]
  got = (std_of(wi), std_of(out.reshape(-1, 64)), std_of(embed))
  np.testing.assert_allclose(got, want, rtol=0.06)


def test_peri_ln_normalises_the_embeddings_and_dyt_takes_its_alpha_per_site():
  c = tiny("decoder", "peri")
  params = nn.unbox(initializer(c)(KEY))
  assert c.has_embed_norm and "embed_norm" in params["embed"]
  assert "embed_norm" not in nn.unbox(initializer(tiny("decoder", "sandwich"))(KEY))["embed"]
  c = tiny("decoder", "pre", norm="dyt", dyt_alpha=0.2, dyt_alpha_attention=0.8)
  c = c.replace(embed_scale_learned=True)
  layer = nn.unbox(initializer(c)(KEY))
  block = layer["decoder"]["layer_0"]
  assert float(block["self_attn_norm"]["alpha"]) == pytest.approx(0.8)
  assert float(block["ffn_norm"]["alpha"]) == pytest.approx(0.2)
  assert float(layer["final_norm"]["alpha"]) == pytest.approx(0.2)
  assert float(layer["embed"]["embed_gain"]) == pytest.approx(math.sqrt(c.d_model))
  with pytest.raises(ValueError, match=r"^model.init='he': choose one of gpt2, xavier"):
    tiny("decoder", "pre", init="he")
