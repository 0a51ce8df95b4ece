"""The residual-stream schemes: hyper-connections (hyper, mhc), nGPT (ngpt) and value residual
learning (model.value_residual), each against its paper's formula written out here, plus what
each adds beyond a placement: the streams at init, Sinkhorn's doubly stochastic matrices,
nGPT's unit-norm weights after every step (solo and population), the first block's values in
the KV cache. The registry tests of tests/test_norm_zoo.py cover the three placements on every
family, looped and scanned, counted and trained."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.interop.common import UnsupportedConfig
from transformers_jax.interop.hf_export import save_hf
from transformers_jax.models import build_model, counting, flops, initializer
from transformers_jax.modules.block import Block, Stack, loop_to_scan
from transformers_jax.modules.placement_base import Placement
from transformers_jax.modules.placements import PLACEMENTS, sinkhorn
from transformers_jax.tasks import task_for
from transformers_jax.train import optim
from transformers_jax.train.step import make_update

from conftest import load_script
from test_decode import PROMPTS, SMALL, full_logits, init, run
from test_norm_zoo import layernorm, reference_attention, reference_ffn

tiny = load_script("norm_zoo_grid").tiny_config
KEY = jax.random.PRNGKey(0)
N = 4  # streams
XS = jax.random.normal(jax.random.PRNGKey(1), (2, 4, N, 8))  # one block's n streams [B, T, n, D]
X = XS[:, :, 0]  # [B, T, D]


def perturbed(params, scale=0.3):
  """Every gain moved by a random amount (zeros included), so that each term of a formula shows."""
  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
  moved = [
      v + scale * jax.random.normal(k, v.shape) if "_gain" in jax.tree_util.keystr(path) else v
      for (path, v), k in zip(leaves, keys)
  ]
  return jax.tree_util.tree_unflatten(tree, moved)


def block_of(placement, x, layer=1, **overrides):
  """(output, params, config) of one encoder Block (bidirectional) at `x`, gains perturbed."""
  c = tiny("encoder", placement, num_layers=4, head="pooler", **overrides)
  block = Block(c, layer=layer, num_layers=4)
  params = perturbed(nn.unbox(block.init(KEY, x)["params"]))
  return np.asarray(block.apply({"params": params}, x)), params, c


def sublayers(p, c):
  """The pre-LN sublayers T(h) = f(N(h)) of one block, written out."""
  renamed = lambda q: {**q, "q": q["query"], "k": q["key"], "v": q["value"]}  # noqa: E731
  return {
      "self_attn": lambda h: reference_attention(
          layernorm(h, p["self_attn_norm"]), renamed(p["self_attn"]), c
      ),
      "ffn": lambda h: reference_ffn(layernorm(h, p["ffn_norm"]), p["ffn"]),
  }


# ----------------------------------------------------------------------------- hyper-connections
def hyper_connection(H, p, name, T, dynamic):
  """Zhu et al. 2024: (h_0; H') = A^T H, stream j <- B_j T(h_0) + h'_j; dynamic:
  A + s_a tanh(N(H) W_a), B + s_b tanh(N(H) W_b)."""
  H = np.asarray(H, np.float64)
  A = np.broadcast_to(p[f"{name}_hc_alpha_gain"], H.shape[:-2] + (N, N + 1)).astype(np.float64)
  B = np.broadcast_to(p[f"{name}_hc_beta_gain"], H.shape[:-2] + (N,)).astype(np.float64)
  if dynamic:
    Hn = layernorm(H, p[f"{name}_hc_norm"])
    A = A + p[f"{name}_hc_alpha_scale_gain"] * np.tanh(Hn @ p[f"{name}_hc_alpha_fn_gain"])
    B = B + p[f"{name}_hc_beta_scale_gain"] * np.tanh(Hn @ p[f"{name}_hc_beta_fn_gain"])
  h0 = sum(A[..., i, 0:1] * H[..., i, :] for i in range(N))
  y = np.asarray(T(jnp.asarray(h0, jnp.float32)), np.float64)
  streams = [
      B[..., j : j + 1] * y + sum(A[..., i, j + 1 : j + 2] * H[..., i, :] for i in range(N))
      for j in range(N)
  ]
  return np.stack(streams, axis=-2)


@pytest.mark.parametrize("dynamic", [False, True])
def test_hyper_connections_equal_the_papers_formula(dynamic):
  out, p, c = block_of("hyper", XS, hyper_dynamic=dynamic)
  T = sublayers(p, c)
  want = hyper_connection(XS, p, "self_attn", T["self_attn"], dynamic)
  want = hyper_connection(want, p, "ffn", T["ffn"], dynamic)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_hyper_connections_start_as_the_paper_says_and_equal_pre_ln():
  """Block l's sublayer j (the k = 2l + j-th layer) starts with A_m = e_{k mod n}, A_r = I,
  B = 1 (the dynamic terms at 0, their factors at 0.01); the whole model then equals pre-LN,
  its parameters being pre-LN's plus the connections: the sum of the n streams is n times
  pre-LN's stream (a final norm takes out the n but for its epsilon). mHC starts alike."""
  c = tiny("decoder", "hyper", num_layers=3, hyper_dynamic=True)
  params = nn.unbox(initializer(c)(KEY))
  for layer in range(3):
    block = params["decoder"][f"layer_{layer}"]
    for j, name in enumerate(("self_attn", "ffn")):
      alpha = np.zeros((N, N + 1))
      alpha[(2 * layer + j) % N, 0] = 1.0
      alpha[:, 1:] = np.eye(N)
      np.testing.assert_array_equal(block[f"{name}_hc_alpha_gain"], alpha)
      np.testing.assert_array_equal(block[f"{name}_hc_beta_gain"], np.ones(N))
      np.testing.assert_array_equal(block[f"{name}_hc_alpha_fn_gain"], np.zeros((8, N + 1)))
      assert float(block[f"{name}_hc_beta_scale_gain"]) == pytest.approx(0.01)
  tokens = jax.random.randint(KEY, (2, 6), 0, c.vocab_size)
  pre = tiny("decoder", "pre", num_layers=3, final_norm=False)
  for placement in ("hyper", "mhc"):
    c = tiny("decoder", placement, num_layers=3, final_norm=False)
    c = c.replace(hyper_dynamic=placement == "hyper")
    params = nn.unbox(initializer(c)(KEY))
    shared = jax.tree_util.tree_map_with_path(
        lambda path, _, params=params: _at(params, path),
        nn.unbox(jax.eval_shape(initializer(pre), KEY)),
    )
    # the n streams stay copies of pre-LN's one; the stack's output is their sum
    np.testing.assert_allclose(
        build_model(c).apply({"params": params}, tokens)["hidden"],
        N * build_model(pre).apply({"params": shared}, tokens)["hidden"],
        rtol=1e-5,
        atol=1e-5,
    )


def _at(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


# ----------------------------------------------------------------------------- mHC
def sinkhorn_reference(logits, iterations=20):
  m = np.exp(np.asarray(logits, np.float64))
  for _ in range(iterations):
    m = m / m.sum(-2, keepdims=True)
    m = m / m.sum(-1, keepdims=True)
  return m


def test_sinkhorn_makes_rows_and_columns_sum_to_one():
  """The paper's 20 iterations bring logits of the spread mHC starts from (and well beyond:
  std 0.5, entries e^+-2 apart) to rows and columns summing to 1 within 1e-5; much wider
  logits converge more slowly (mHC-lite's point), where the result still equals the
  iterations written out."""
  logits = 0.5 * jax.random.normal(KEY, (3, 50, N, N))
  m = np.asarray(sinkhorn(logits))
  assert (m >= 0).all()
  np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(m.sum(-2), 1.0, atol=1e-5)
  wide = 3.0 * logits
  np.testing.assert_allclose(sinkhorn(wide), sinkhorn_reference(wide), atol=1e-6)


def manifold_connection(H, p, name, T, eps=1e-5):
  """Xie et al. 2025: x' = RMS(vec(x)); H_pre = sigmoid(a x' phi + b), H_post = 2 sigmoid(..),
  H_res = Sinkhorn(a mat(x' phi) + b); x <- H_res x + H_post^T T(H_pre x)."""
  H = np.asarray(H, np.float64)
  flat = H.reshape(*H.shape[:-2], -1)
  x = flat / np.sqrt((flat**2).mean(-1, keepdims=True) + eps)
  g = lambda part: p[f"{name}_mhc_{part}"]  # noqa: E731
  sigmoid = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
  pre = sigmoid(g("pre_scale_gain") * (x @ g("pre_fn_gain")) + g("pre_bias_gain"))
  post = 2 * sigmoid(g("post_scale_gain") * (x @ g("post_fn_gain")) + g("post_bias_gain"))
  res_logits = g("res_scale_gain") * (x @ g("res_fn_gain")).reshape(*x.shape[:-1], N, N)
  res = sinkhorn_reference(res_logits + g("res_bias_gain"))
  h_in = sum(pre[..., i : i + 1] * H[..., i, :] for i in range(N))
  y = np.asarray(T(jnp.asarray(h_in, jnp.float32)), np.float64)
  streams = [
      sum(res[..., i, j : j + 1] * H[..., j, :] for j in range(N)) + post[..., i : i + 1] * y
      for i in range(N)
  ]
  return np.stack(streams, axis=-2)


def test_mhc_equals_the_papers_formula_and_starts_as_pre_ln():
  out, p, c = block_of("mhc", XS)
  T = sublayers(p, c)
  want = manifold_connection(XS, p, "self_attn", T["self_attn"])
  want = manifold_connection(want, p, "ffn", T["ffn"])
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  p = nn.unbox(Block(c, layer=0, num_layers=4).init(KEY, X)["params"])  # the initial values
  assert float(p["ffn_mhc_res_scale_gain"]) == pytest.approx(0.01)
  np.testing.assert_allclose(1 / (1 + np.exp(-p["ffn_mhc_pre_bias_gain"])), 1 / N, rtol=1e-6)
  np.testing.assert_array_equal(p["ffn_mhc_post_bias_gain"], np.zeros(N))
  np.testing.assert_array_equal(p["ffn_mhc_res_fn_gain"], np.zeros((N * 8, N * N)))


# ----------------------------------------------------------------------------- nGPT
def unit(x, axis=-1):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=axis, keepdims=True)


def ngpt_block(x, p, c):
  """Loshchilov et al. 2024, one block: h_A = Norm(ATTN(h)), h <- Norm(h + a_A (h_A - h)), the
  same for the MLP; q, k on the sphere times s_qk, scores sqrt(d_k) q.k; u s_u, v s_v sqrt(D)."""
  D, K = c.d_model, c.head_width
  base = D**-0.5
  h = unit(x)

  a = p["self_attn"]
  q, k, v = (
      np.einsum("btd,dhk->bthk", h, a[n]["kernel"]) + a[n]["bias"]
      for n in ("query", "key", "value")
  )
  s_qk = a["qk_scale_gain"] * (1.0 / base)
  q, k = unit(q) * s_qk, unit(k) * s_qk
  scores = math.sqrt(K) * np.einsum("bqhk,bshk->bhqs", q, k)
  w = np.exp(scores - scores.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  o = np.einsum("bhqs,bshk->bqhk", w, v)
  attn = np.einsum("bthk,hkd->btd", o, a["out"]["kernel"]) + a["out"]["bias"]
  h = unit(h + p["self_attn_eigen_gain"] * (0.05 / base) * (unit(attn) - h))
  f = p["ffn"]
  u = (h @ f["wi_1"]["kernel"] + f["wi_1"]["bias"]) * f["up_gain"]
  gate = (h @ f["wi_0"]["kernel"] + f["wi_0"]["bias"]) * f["gate_gain"] * math.sqrt(D)
  mlp = (u * gate / (1 + np.exp(-gate))) @ f["wo"]["kernel"] + f["wo"]["bias"]
  return unit(h + p["ffn_eigen_gain"] * (0.05 / base) * (unit(mlp) - h))


def test_ngpt_block_equals_the_papers_formula():
  out, p, c = block_of("ngpt", X, activation="swiglu", num_heads=2)
  p = jax.tree_util.tree_map(lambda v: np.asarray(v, np.float64), p)
  np.testing.assert_allclose(out, ngpt_block(np.asarray(X), p, c), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(out, axis=-1), 1.0, rtol=1e-6)
  fresh = nn.unbox(Block(c, layer=0, num_layers=4).init(KEY, X)["params"])
  np.testing.assert_allclose(fresh["ffn_eigen_gain"], np.full(8, 8**-0.5))  # alpha = 0.05
  np.testing.assert_allclose(fresh["self_attn"]["qk_scale_gain"], np.full((2, 4), 8**-0.5))


def test_ngpt_logits_are_s_z_times_cosines_and_the_chunked_loss_reads_the_same():
  c = tiny("decoder", "ngpt", tie_embeddings=False)
  params = perturbed(nn.unbox(jax.jit(initializer(c))(KEY)))  # one program each
  out = jax.jit(build_model(c).apply)({"params": params}, jnp.arange(6)[None] % c.vocab_size)
  hidden = np.asarray(out["hidden"])
  np.testing.assert_allclose(np.linalg.norm(hidden, axis=-1), 1.0, rtol=1e-5)
  s_z = params["logit_gain"]["scale"] * c.d_model**0.5
  want = (hidden @ params["lm_head"]["kernel"]) * s_z
  np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(hidden @ out["unembedding"], want, rtol=1e-5, atol=1e-5)


# which axis of each weight is d_model-long, written out for the config below (scanned blocks:
# the layer axis first)
UNIT = {
    ("embed", "token_embed", "embedding"): -1,
    ("embed", "pos_embed", "embedding"): -1,
    ("lm_head", "kernel"): 0,
    ("self_attn", "query", "kernel"): 1,
    ("self_attn", "key", "kernel"): 1,
    ("self_attn", "value", "kernel"): 1,
    ("self_attn", "out", "kernel"): -1,
    ("ffn", "wi_0", "kernel"): 1,
    ("ffn", "wi_1", "kernel"): 1,
    ("ffn", "wo", "kernel"): -1,
}


def assert_unit_norms(params, member_axis=False):
  checked = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = tuple(k.key for k in path)
    axis = next((a for suffix, a in UNIT.items() if names[-len(suffix) :] == suffix), None)
    if axis is None:
      continue
    axis = axis + 1 if member_axis and axis >= 0 else axis
    np.testing.assert_allclose(np.linalg.norm(leaf, axis=axis), 1.0, atol=1e-3, err_msg=names)
    checked += 1
  assert checked == len(UNIT)


def test_ngpt_weights_are_unit_norm_after_every_update_solo_and_in_a_population(experiment):
  """The update body both drivers run: after optax's step each constrained matrix is back on
  the sphere, for one model and for a population's members (vmapped over a member axis)."""
  config = experiment("gpt2", "tiny")
  fields = dict(d_model=8, num_heads=2, d_ff=16, num_layers=2, max_len=8, vocab_size=16)
  fields.update(norm_placement="ngpt", activation="swiglu", tie_embeddings=False)
  config.update_from_flattened_dict(
      {**{f"model.{k}": v for k, v in fields.items()}, "model.scan_layers": True}
  )
  config.update_from_flattened_dict({"learning_rate": 0.05, "warmup_steps": 0, "batch_size": 2})
  model_cfg = ModelConfig.from_dict(config.model)
  update = make_update(
      task_for(model_cfg, config), model_cfg, config, lambda h: optim.make_optimizer(config, h)
  )
  params = nn.unbox(jax.jit(initializer(model_cfg))(KEY))  # (a scanned init: one program)
  assert_unit_norms(params)  # the initial parameters are constrained too
  batch = {"tokens": jax.random.randint(KEY, (2, 7), 0, 16)}
  hparams = optim.config_hparams(config)
  step = jax.jit(update)
  state = (params, jax.jit(optim.make_optimizer(config).init)(params))
  for i in range(3):
    *state, _ = step(*state, batch, jax.random.PRNGKey(i), hparams)
  wo = lambda p: p["decoder"]["layers"]["ffn"]["wo"]["kernel"]  # noqa: E731
  assert float(jnp.abs(wo(state[0]) - wo(params)).max()) > 1e-3  # the weights moved
  assert_unit_norms(state[0])

  members = {k: jnp.asarray([v, v]) for k, v in hparams.items()}
  members["learning_rate"] = jnp.asarray([0.05, 0.2])
  stacked = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), params)
  opt_state = jax.jit(jax.vmap(lambda p, h: optim.make_optimizer(config, h).init(p)))(
      stacked, members
  )
  vstep = jax.jit(jax.vmap(update, in_axes=(0, 0, None, None, 0)))
  new, _, _ = vstep(stacked, opt_state, batch, KEY, members)
  assert_unit_norms(new, member_axis=True)


# ----------------------------------------------------------------------------- value residual
def test_value_residual_equals_resformers_formula_on_two_blocks_looped_and_scanned():
  """Block 0 as pre-LN, block 1's attention reading l1 V_2 + l2 V_1 (ResFormer), V_1 the first
  block's values: the looped stack, and the scanned one with the same parameters."""
  c = tiny("encoder", "pre", num_layers=2, head="pooler", value_residual=True, num_kv_heads=1)
  stack = Stack(c, 2)
  params = nn.unbox(stack.init(KEY, X)["params"])
  params["layer_1"]["self_attn"]["value_residual_gain"] = jnp.asarray([0.7, -0.4])
  out = stack.apply({"params": params}, X)
  H, K = c.num_heads, c.head_width

  def block(x, p, first_values=None):
    a = p["self_attn"]
    h = layernorm(x, p["self_attn_norm"])
    q, k, v = (
        np.einsum("btd,dgk->btgk", h, a[n]["kernel"]) + a[n]["bias"]
        for n in ("query", "key", "value")
    )  # one key/value head (MQA)
    if first_values is not None:
      l1, l2 = a["value_residual_gain"]
      v = l1 * v + l2 * first_values
    w = jax.nn.softmax(np.einsum("bqhk,bsk->bhqs", q, k[:, :, 0]) / math.sqrt(K), axis=-1)
    o = np.einsum("bhqs,bsk->bqhk", w, v[:, :, 0])
    y = x + np.einsum("bthk,hkd->btd", o, a["out"]["kernel"]) + a["out"]["bias"]
    return y + reference_ffn(layernorm(y, p["ffn_norm"]), p["ffn"]), v

  x1, v1 = block(X, params["layer_0"])
  want, _ = block(x1, params["layer_1"], v1)
  assert H == 2
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  scanned = Stack(c.replace(scan_layers=True), 2).apply({"params": loop_to_scan(params)}, X)
  np.testing.assert_allclose(scanned, out, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("placement", ["pre", "hyper", "ngpt", "admin"])
def test_value_residual_works_with_any_placement_and_is_counted_as_gains(placement):
  c = tiny("encoder_decoder", placement, value_residual=True)
  shapes = nn.unbox(jax.eval_shape(initializer(c), KEY))
  breakdown = counting.tree_breakdown(shapes, c)
  assert breakdown == counting.analytic_breakdown(c)
  without = counting.analytic_breakdown(c.replace(value_residual=False))
  assert breakdown["gains"] - without.get("gains", 0) == 2 * (2 + 2)  # (l1, l2) per block
  params = nn.unbox(initializer(c)(KEY))
  assert np.isfinite(float(load_script("norm_zoo_grid").loss_of(c)(params)))


@pytest.mark.parametrize(
    "family,extra",
    [
        ("decoder", dict(positions="rope", num_kv_heads=2, value_residual=True)),
        ("encoder_decoder", dict(positions="sinusoidal", scan_layers=True, value_residual=True)),
        ("decoder", dict(norm_placement="ngpt", positions="rope", num_kv_heads=2)),
        ("decoder", dict(norm_placement="hyper", hyper_dynamic=True, scan_layers=True)),
    ],
)
def test_cached_decoding_equals_the_full_forward(family, extra):
  """Each cached step's logits equal a forward pass over the sequence so far: the cache holds
  the mixed values (V_1 at a new position comes from the first block in the same call), and
  the streams and unit-sphere queries live per token."""
  cfg = ModelConfig(family=family, **SMALL, **extra)
  params = init(cfg)
  out = run(cfg, params, PROMPTS, 6, return_logits=True)
  full = full_logits(cfg, params, PROMPTS, out.tokens)
  for b in range(len(PROMPTS)):
    n = out.lengths[b] + out.stopped[b]
    np.testing.assert_allclose(out.logits[b, :n], full[b, :n], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "placement,fields,field",
    [
        ("hyper", {}, "norm_placement"),
        ("mhc", {}, "norm_placement"),
        ("ngpt", {}, "norm_placement"),
        ("pre", {"value_residual": True}, "value_residual"),
    ],
)
def test_hugging_face_export_refuses_them_in_one_line(placement, fields, field, tmp_path):
  c = tiny("decoder", placement, **fields)
  with pytest.raises(UnsupportedConfig, match=f"^cannot write model.{field}="):
    save_hf(tmp_path, c, jax.eval_shape(initializer(c), KEY))
  assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "placement,fields,message",
    [
        ("pre", {"residual_streams": 2}, "model.residual_streams=2: norm_placement=pre does not"),
        ("mhc", {"hyper_dynamic": True}, "model.hyper_dynamic=True: norm_placement=mhc does not"),
        ("mhc", {"residual_streams": 1}, "model.residual_streams=1: mhc needs n >= 2"),
        ("hyper", {"residual_streams": 0}, "model.residual_streams=0: must be a positive"),
        ("hyper", {"residual": False}, "model.residual=False: norm_placement=hyper has its own"),
        ("ngpt", {"feed_forward": "moe"}, "model.feed_forward='moe': nGPT's MLP scales"),
        ("ngpt", {"lora_rank": 2}, "model.lora_rank=2: LoRA's adapters"),
    ],
)
def test_settings_they_cannot_take_are_refused_in_one_line(placement, fields, message):
  with pytest.raises(ValueError, match="^" + message):
    tiny("decoder", placement, **fields)
  assert PLACEMENTS[placement].unavailable == ""


class Unbuilt(Placement):
  unavailable = "it needs something this code does not have: not built"


def test_a_placement_that_cannot_be_built_is_refused_with_its_reason(monkeypatch):
  """(nGPT was such an entry until its per-step constraint existed.)"""
  monkeypatch.setitem(PLACEMENTS, "unbuilt", Unbuilt())
  with pytest.raises(ValueError, match="^model.norm_placement='unbuilt': it needs something"):
    tiny("decoder", "unbuilt")


@pytest.mark.parametrize(
    "fields",
    [
        dict(norm_placement="hyper", hyper_dynamic=True, value_residual=True, scan_layers=True),
        dict(norm_placement="mhc", scan_layers=False),
        dict(norm_placement="ngpt", scan_layers=True, **{"population.seeds": 2}),
    ],
    ids=["hyper-value_residual", "mhc", "ngpt-population"],
)
def test_compile_only_with_remat_compiles_the_step_and_counts_it(experiment, fields):
  """--compile_only's report of the training step (a population's for ngpt), remat on: the
  parameters it counts are param_count's, whose breakdown sums to its total."""
  from transformers_jax.train import compile as compile_step

  config = experiment("gpt2", "tiny")
  model = {f"model.{k}": v for k, v in fields.items() if "." not in k}
  config.update_from_flattened_dict(
      {**model, "model.num_layers": 2, "model.remat": "full"}
      | {k: v for k, v in fields.items() if "." in k}
  )
  summary = flops.summary(config)
  assert (
      sum(summary["breakdown"].values())
      == summary["total"]
      == counting.analytic_count(ModelConfig.from_dict(config.model))
  )
  assert compile_step.report(config, verbose=False)["params"] == summary["total"]
