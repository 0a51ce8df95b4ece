"""gpt-oss and Qwen3-MoE as options of the one Block: attention sinks in every attention path
(modules/sinks.py), YaRN RoPE scaling (modules/yarn.py), the router's bias and top-k
normalisation and gpt-oss's clamped SwiGLU in the dense and ragged experts (modules/glu.py),
their one-line refusals, and the Hugging Face mappings' refusals (interop/gpt_oss.py,
qwen3_moe.py). The fixtures' logits, greedy decoding and round trips are in test_interop.py
and test_open_models.py; expert parallelism and the context axis in moe_worker.py."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from conftest import shaken
from transformers_jax.config import ModelConfig
from transformers_jax.modules.attention import attend
from transformers_jax.modules.feed_forward import MoE
from transformers_jax.modules.masks import AttentionMask, with_window

from conftest import ROOT, run_worker

FIXTURES = ROOT / "tests" / "fixtures" / "hf"
B, T, H, G, K = 2, 20, 4, 2, 8


def written_out(q, k, v, sinks, window):
  """gpt-oss's eager attention: scores, causal window mask, the sink as one more column of the
  softmax, dropped after it."""
  kk, vv = (jnp.repeat(x, H // G, axis=2) for x in (k, v))
  s = jnp.einsum("bthk,bshk->bhts", q, kk) / K**0.5
  i, j = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
  s = jnp.where((j <= i) & (i - j < window), s, -jnp.inf)
  sink = jnp.broadcast_to(sinks[None, :, None, None], (B, H, T, 1))
  p = jax.nn.softmax(jnp.concatenate([s, sink], axis=-1), axis=-1)[..., :-1]
  return jnp.einsum("bhts,bshk->bthk", p, vv)


def test_attention_sinks_take_every_path_and_gradient_as_written_out():
  """einsum, the fused call (an extra key), flash in blocks of 8 (the sink starts the online
  softmax) and splash (the Pallas kernel in interpret mode), with and without a window of 5:
  outputs and the gradients of queries, keys, values and sinks, in one program."""
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v = (jax.random.normal(kk, (B, T, n, K)) for kk, n in zip(keys, (H, G, G)))
  sinks = 2.0 * jax.random.normal(keys[3], (H,))  # large enough to take much of the weight

  @jax.jit
  def everything(q, k, v, sinks):
    out = {}
    for window in (T, 5):
      mask = with_window(AttentionMask(causal=True), window if window < T else None)
      paths = {
          impl: lambda q, k, v, s, impl=impl, mask=mask: attend(
              q, k, v, mask, True, None, impl, 4, 8, 8, sinks=s
          )
          for impl in ("einsum", "fused", "flash", "splash")
      }
      paths["reference"] = lambda q, k, v, s, w=window: written_out(q, k, v, s, w)
      for name, f in paths.items():
        loss = lambda *a, f=f: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
        out[name, window] = (
            f(q, k, v, sinks),
            jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, sinks),
        )
    return out

  out = everything(q, k, v, sinks)
  for (name, window), (value, grads) in out.items():
    want, want_grads = out["reference", window]
    np.testing.assert_allclose(value, want, atol=2e-6, err_msg=f"{name} {window}")
    for got, ref in zip(grads, want_grads):
      np.testing.assert_allclose(got, ref, atol=5e-6, err_msg=f"{name} {window}")
  # the sinks take weight: the output is smaller than attention without them
  plain = attend(q, k, v, AttentionMask(causal=True), True, impl="einsum")
  assert float(jnp.abs(out["einsum", T][0]).mean()) < 0.9 * float(jnp.abs(plain).mean())


def test_gpt_oss_scanned_with_remat_equals_its_looped_self():
  """The fixture's model (sinks, alternating windows, YaRN, clamped experts with biases) in the
  scanned layout with full remat: the logits and every gradient as looped."""
  from transformers_jax.interop import load_hf
  from transformers_jax.models import build_model
  from transformers_jax.modules.block import loop_to_scan

  fields, params = load_hf(FIXTURES / "gpt_oss")
  tokens = np.load(FIXTURES / "gpt_oss" / "reference.npz")["tokens"]
  scanned = dict(fields, scan_layers=True, remat="full")

  @jax.jit
  def both(params):
    def loss(fields, params):
      logits = build_model(fields).apply({"params": params}, tokens)["logits"]
      return jnp.sum(jnp.sin(logits)), logits

    looped = jax.value_and_grad(lambda p: loss(fields, p), has_aux=True)(params)
    stacked = jax.value_and_grad(lambda p: loss(scanned, p), has_aux=True)(loop_to_scan(params))
    return looped, stacked

  ((_, logits), grads), ((_, logits_scanned), grads_scanned) = both(params)
  np.testing.assert_allclose(logits_scanned, logits, atol=2e-5)
  for a, b in zip(
      jax.tree_util.tree_leaves(loop_to_scan(grads)), jax.tree_util.tree_leaves(grads_scanned)
  ):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()))


def test_yarn_frequencies_and_attention_factor_equal_transformers():
  """transformers' own YaRN (scripts/make_hf_fixtures.py wrote them): gpt-oss's setting, and the
  truncated one with an explicit attention factor of 1."""
  from transformers_jax.modules.positions import apply_rope, rope_frequencies
  from transformers_jax.modules.yarn import parse_yarn

  want = np.load(FIXTURES / "rope_yarn.npz")
  for name, text in (("gpt_oss", "yarn:32,32,1,4096,0"), ("truncated", "yarn:32,32,1,4096,1,1")):
    got = rope_frequencies(64, 150000.0, text)
    np.testing.assert_allclose(got, want[f"{name}_inv_freq"], rtol=1e-6, err_msg=name)
    assert parse_yarn(text).scale == pytest.approx(float(want[f"{name}_factor"]), rel=1e-12)
  # queries and keys are scaled by the factor: a rotation's norm times 1 + 0.1 ln 32
  x = jnp.ones((1, 1, 1, 64))
  rotated = apply_rope(x, jnp.zeros((1, 1), jnp.int32), 150000.0, "yarn:32,32,1,4096,0")
  np.testing.assert_allclose(rotated, x * (1 + 0.1 * np.log(32)), rtol=1e-6)


def test_clamped_swiglu_is_gpt_oss_formula():
  from transformers_jax.modules.glu import ClampedSwiGLU, combine

  gate, up = np.linspace(-9, 9, 13, dtype=np.float32), np.linspace(9, -9, 13, dtype=np.float32)
  g, u = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
  want = (u + 1) * g / (1 + np.exp(-1.702 * g))
  np.testing.assert_allclose(combine(ClampedSwiGLU(1.702, 7.0), gate, up), want, rtol=1e-6)
  np.testing.assert_allclose(combine(jax.nn.silu, gate, up), jax.nn.silu(gate) * up, rtol=1e-6)


SMALL = dict(feed_forward="moe", num_experts=4, d_model=16, d_ff=32, capacity_factor=4.0)


@pytest.mark.parametrize(
    "options",
    [
        dict(activation="swiglu_clamped", glu_limit=0.5, router_bias=True, top_k=2),
        dict(activation="swiglu", use_bias=False, router_norm_topk=False, top_k=3),
    ],
    ids=["gpt_oss", "qwen3_moe"],
)
def test_router_and_expert_options_take_dense_and_ragged_alike(options):
  """gpt-oss's router bias and clamped experts with biases (a limit these activations pass),
  and Qwen3-MoE's un-renormalised top-k weights: the ragged layer equals the dense reference,
  outputs and every gradient, in one program."""
  c = ModelConfig(**SMALL, **options)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 16))

  @jax.jit
  def both(x):
    params = shaken(MoE(c).init(jax.random.PRNGKey(1), x)["params"], 0.5, seed=2)

    def run(c):
      def loss(params):
        out = MoE(c).apply({"params": params}, x, mutable=["losses", "moe_stats"])[0]
        return jnp.sum(jnp.sin(out)), out

      return jax.value_and_grad(loss, has_aux=True)(params)

    return params, run(c), run(c.replace(moe_impl="ragged"))

  params, ((_, dense), dense_grads), ((_, ragged), grads) = both(x)
  assert ("bias" in params["router"]) == c.router_bias
  np.testing.assert_allclose(ragged, dense, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(dense_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))
  if c.router_bias:
    assert np.abs(nn.unbox(grads)["router"]["bias"]).max() > 0


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(glu_limit=5.0), r"^model.glu_limit=5.0: only activation=swiglu_clamped reads it"),
        (dict(activation="swiglu_clamped", glu_alpha=0.0), r"^model.glu_alpha=0.0: must be pos"),
        (dict(router_bias=True), r"^model.router_bias=True: only a mixture of experts has a"),
        (dict(router_norm_topk=False), r"^model.router_norm_topk=False: only a mixture of"),
        (dict(attention_sinks=True, attention_impl="cudnn"), r"^model.attention_impl='cudnn':"),
        (dict(positions="rope", rope_scaling="yarn:32,1,32,4096"), r"^model.rope_scaling="),
        (dict(positions="rope", rope_scaling="yarn:32,32,1,4096,2"), r"^model.rope_scaling="),
    ],
)
def test_settings_nothing_can_run_or_read_are_refused_in_one_line(fields, match):
  with pytest.raises(ValueError, match=match) as raised:
    ModelConfig(**fields)
  assert "\n" not in str(raised.value)


def _edited(tmp_path, name, **changes):
  d = shutil.copytree(FIXTURES / name, tmp_path / name)
  config = json.loads((d / "config.json").read_text())
  config.update(changes)
  (d / "config.json").write_text(json.dumps(config))
  return d


@pytest.mark.parametrize(
    "name,changes,match",
    [
        ("gpt_oss", dict(layer_types=["full_attention", "sliding_attention"] * 2), "layer_types"),
        ("gpt_oss", dict(attention_bias=False), "attention_bias=False"),
        ("gpt_oss", dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
        ("qwen3_moe", dict(mlp_only_layers=[1]), "mlp_only_layers=.1."),
        ("qwen3_moe", dict(decoder_sparse_step=2), "decoder_sparse_step=2"),
        ("qwen3_moe", dict(rope_parameters={"rope_type": "longrope"}), "'longrope'"),
    ],
)
def test_config_values_the_mapping_cannot_hold_are_refused_naming_the_key(
    tmp_path, name, changes, match
):
  from transformers_jax.interop import UnsupportedArchitecture, load_hf

  with pytest.raises(UnsupportedArchitecture, match=match) as raised:
    load_hf(_edited(tmp_path, name, **changes))
  assert "\n" not in str(raised.value)


def test_gpt_oss_experts_in_mxfp4_read_as_the_floating_point_ones():
  """gpt_oss_mxfp4 is the gpt_oss fixture with its experts packed as the released files pack
  them (scripts/make_hf_fixtures.py: transformers reads it to the same outputs): the same fields
  and every parameter bit for bit."""
  from transformers_jax.interop import load_hf

  fields, params = load_hf(FIXTURES / "gpt_oss")
  packed_fields, packed = load_hf(FIXTURES / "gpt_oss_mxfp4")
  assert packed_fields == fields
  for a, b in zip(jax.tree_util.tree_leaves(packed), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_exports_keep_what_each_architecture_holds(tmp_path):
  """gpt-oss's sinks are not Mixtral's, a YaRN model is not Llama's, and Qwen3-MoE's
  un-renormalised routing is not Mixtral's either; each is written as its own type, and the
  hub's key names read as transformers 5 writes them."""
  from transformers_jax.interop import UnsupportedConfig, load_hf, save_hf

  fields, params = load_hf(FIXTURES / "gpt_oss")
  assert fields["sliding_every"] == 2 and fields["rope_scaling"] == "yarn:4,8,2,16,0"
  assert save_hf(tmp_path / "a", fields, params) == "GptOssForCausalLM"
  with pytest.raises(UnsupportedConfig, match=r"cannot write model\.\w+=.* as MixtralForCausalLM"):
    save_hf(tmp_path / "b", fields, params, "MixtralForCausalLM")
  fields, params = load_hf(FIXTURES / "qwen3_moe")
  assert not fields["router_norm_topk"] and fields["qk_norm"]
  unnormed = dict(fields, qk_norm=False)  # (the check reads the config before the parameters)
  with pytest.raises(UnsupportedConfig, match="model.router_norm_topk=False as MixtralForCausal"):
    save_hf(tmp_path / "c", unnormed, params, "MixtralForCausalLM")
  assert save_hf(tmp_path / "d", fields, params) == "Qwen3MoeForCausalLM"
  written = json.loads((tmp_path / "d" / "config.json").read_text())
  assert written["num_experts"] == 6 and written["norm_topk_prob"] is False
  yarn = dict(fields, rope_scaling="yarn:4,8,2,16")
  assert save_hf(tmp_path / "e", yarn, params) == "Qwen3MoeForCausalLM"
  assert load_hf(tmp_path / "e")[0]["rope_scaling"] == "yarn:4,8,2,16,1"
  fields, params = load_hf(FIXTURES / "llama")
  with pytest.raises(UnsupportedConfig, match="model.rope_scaling='yarn:4,8,2,16' as LlamaFor"):
    save_hf(tmp_path / "f", dict(fields, rope_scaling="yarn:4,8,2,16"), params)


@pytest.fixture(scope="module")
def parallel_runs():
  """experiments/gpt_oss.py:tiny (a sliding block and a full one) trained on one device, and
  with experts over 2 devices x tokens over a context axis of 2 (all-gather and the ring) x
  parameters over fsdp 2: the experts' all-to-all in both (a mesh of experts alone takes the
  same path; tests/test_moe.py trains one over 4)."""
  meshes = {
      "one": {"data": 1},
      "expert2_context2_fsdp2": {"fsdp": 2, "context": 2, "expert": 2},
      "expert2_context2_fsdp2_ring": {
          "fsdp": 2,
          "context": 2,
          "expert": 2,
          "model": {"context_strategy": "ring"},
      },
  }
  spec = {"config": "gpt_oss.py", "steps": 3, "meshes": meshes, "model": {"num_layers": 2}}
  return run_worker("moe_worker.py", spec, devices=8)


@pytest.mark.parametrize("mesh", ["expert2_context2_fsdp2", "expert2_context2_fsdp2_ring"])
def test_gpt_oss_trains_over_experts_and_context_as_on_one_device(parallel_runs, mesh):
  one, split = parallel_runs["one"], parallel_runs[mesh]
  assert one["losses"][0] != one["losses"][-1]
  np.testing.assert_allclose(split["losses"], one["losses"], rtol=2e-5)
  assert "all-to-all" in split["collectives"]


def test_a_gpt_oss_population_member_trains_as_its_solo_run(experiment, tmp_path):
  """Two members (seeds) of gpt_oss.py:tiny vmapped in one step: member 0's losses are its solo
  run's (the ragged experts, the sinks and the alternating windows under the population's
  vmap)."""
  from transformers_jax.train.entry import train

  def config(**fields):
    c = experiment("gpt_oss", "tiny")
    c.update_from_flattened_dict(
        {"steps": 2, "batch_size": 2, "seq_len": 32, "log_every": 1, "eval_every": 100}
        | {"checkpoint_every": 100, "sample.max_new_tokens": 0, "eval_batches": 1}
        | {"device_peak_flops": 1e12, **fields}  # (MFU is not read here)
    )
    return c

  def losses(workdir, member=None):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in rows if "loss" in x and x.get("member") == member]

  train(config(**{"population.seeds": 2}), tmp_path / "population")
  train(config(), tmp_path / "solo")
  np.testing.assert_allclose(losses(tmp_path / "population", 0), losses(tmp_path / "solo"), 1e-5)
  assert losses(tmp_path / "population", 1) != losses(tmp_path / "solo")
