"""Llama 4 in the one Block (experiments/llama4.py): chunked RoPE blocks and NoPE blocks with the
attention temperature, the L2 q/k norm on the RoPE blocks only, the router whose sigmoid weight
scales the expert's input beside a shared expert, MoE in every second block with dense blocks of
their own width. The Hugging Face fixture (tests/test_interop.py, test_open_models.py) holds
logits and greedy tokens to transformers'."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from conftest import shaken
from transformers_jax import decode
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, counting, init_params
from transformers_jax.modules import layer_types
from transformers_jax.modules.block import loop_to_scan, scan_runs
from transformers_jax.modules.feed_forward import MoE

KEY = jax.random.PRNGKey(0)


def tiny(experiment, **changes):
  return ModelConfig.from_dict(experiment("llama4", "tiny").model).replace(**changes)


def perturbed(c, scale=0.3):
  """Initial parameters shaken so that every part acts (the experts' choices vary)."""
  return shaken(nn.unbox(jax.jit(lambda k: init_params(c, k))(KEY)), scale)


def test_scanned_with_remat_and_decoding_past_every_chunk_equal_the_looped_forward(experiment):
  """19 tokens over chunks of 8 and a temperature floor of 4: the stack scanned in runs (dense,
  MoE, dense, MoE) with full remat, and looped decoding (a prefill, then one token at a time
  over ring caches of 8 slots on the chunked blocks, the temperature at the cached positions)
  give the looped forward pass's logits; the dense experts the ragged ones'."""
  c = tiny(experiment)
  assert [c.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
  assert scan_runs(c, 4) == [(0, 1), (1, 1), (2, 1), (3, 1)]
  params = perturbed(c)
  tokens = jax.random.randint(KEY, (2, 19), 0, c.vocab_size)
  want = jax.jit(build_model(c).apply)({"params": params}, tokens)["logits"]
  dense = build_model(c.replace(moe_impl="dense", capacity_factor=1e9))
  np.testing.assert_allclose(
      jax.jit(dense.apply)({"params": params}, tokens)["logits"], want, rtol=1e-5, atol=1e-5
  )
  scanned = build_model(c.replace(scan_layers=True, remat="full"))
  got = jax.jit(scanned.apply)({"params": loop_to_scan(params)}, tokens)["logits"]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  model = build_model(c, decode=True)
  cache = decode.init_cache(model, jnp.zeros((2, 19), jnp.int32))
  slots = {
      path[1].key: leaf.shape[2]
      for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]
      if path[-1].key == "cached_key"
  }
  assert slots == {"layer_0": 8, "layer_1": 8, "layer_2": 8, "layer_3": 19}
  step = jax.jit(lambda p, cache, x: model.apply({"params": p, "cache": cache}, x, mutable=True))
  out = []
  for x in (tokens[:, :5], *(tokens[:, t : t + 1] for t in range(5, 19))):
    logits, state = step(params, cache, x)
    cache = state["cache"]
    out.append(logits["logits"])
  np.testing.assert_allclose(np.concatenate(out, axis=1), want, rtol=1e-4, atol=1e-4)


def test_the_temperature_and_the_qk_norm_take_the_blocks_transformers_gives_them(experiment):
  """Queries of the NoPE blocks times 1 + 0.1 log(1 + floor((p + 1) / floor)), those of the
  RoPE blocks untouched; the L2 norm on the RoPE blocks' queries only: switching either off
  changes only the blocks it concerns, as a traced (scanned) block index selects."""
  c = tiny(experiment)
  q = jax.random.normal(KEY, (1, 12, 4, 16))
  positions = jnp.arange(12)[None]
  scaled = layer_types.temperature(c, q, positions)
  factor = 1 + 0.1 * np.log1p(np.floor((np.arange(12) + 1) / 4))
  np.testing.assert_allclose(scaled, q * factor[None, :, None, None], rtol=1e-6)
  assert [layer_types.layer_attention(c, i, True).rotates for i in range(4)] == [1, 1, 1, 0]
  traced = jax.jit(lambda i: layer_types.layer_attention(c, i, True).rotates)
  assert [bool(traced(i)) for i in range(8)] == [True, True, True, False] * 2
  for i in range(4):  # the block's own choice, static and traced (as under a scan)
    for layer in (
        layer_types.layer_attention(c, i, True),
        layer_types.LayerAttention(rotates=traced(i)),
    ):
      picked = layer_types.nope_only(layer, scaled, q)
      np.testing.assert_array_equal(picked, scaled if i == 3 else q)


def test_the_router_weight_scales_the_experts_input(experiment):
  """Llama 4's MoE: the chosen expert's sigmoid weight multiplies its input, f(w x), with the
  shared expert's f(x) beside it; the ragged and dense paths agree, outputs and gradients, and
  differ from the weight on the output."""
  c = tiny(experiment, d_model=16, num_heads=2, head_dim=8, num_experts=3)
  x = jax.random.normal(KEY, (2, 6, 16))

  @jax.jit
  def run(x):
    params = shaken(MoE(c).init(KEY, x)["params"], 0.5, seed=2)

    def out(c):
      def loss(params):
        y = MoE(c).apply({"params": params}, x, mutable=["losses", "moe_stats"])[0]
        return jnp.sum(jnp.sin(y)), y

      return jax.value_and_grad(loss, has_aux=True)(params)

    dense = c.replace(moe_impl="dense", capacity_factor=1e9)
    return params, out(c), out(dense), out(c.replace(moe_scale_input=False))

  params, ((_, ragged), grads), ((_, dense), dense_grads), ((_, on_output), _) = run(x)
  np.testing.assert_allclose(ragged, dense, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(dense_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))
  params = nn.unbox(params)
  logits = x @ params["router"]["kernel"]
  chosen = jnp.argmax(logits, -1)
  w = jax.nn.sigmoid(jnp.max(logits, -1))[..., None]

  def swiglu(h, wi, wi_1, wo):
    return (jax.nn.silu(h @ wi) * (h @ wi_1)) @ wo

  wi, wi_1, wo = (params[n][chosen] for n in ("wi", "wi_1", "wo"))  # each token's own expert
  h = w * x
  hidden = jax.nn.silu(jnp.einsum("btd,btdf->btf", h, wi)) * jnp.einsum("btd,btdf->btf", h, wi_1)
  shared = params["shared"]
  want = jnp.einsum("btf,btfd->btd", hidden, wo) + swiglu(
      x, *(shared[n]["kernel"] for n in ("wi_0", "wi_1", "wo"))
  )
  np.testing.assert_allclose(ragged, want, rtol=1e-4, atol=1e-4)
  assert np.abs(on_output - ragged).max() > 1e-2


def test_llama3_rope_scaling_with_equal_frequency_factors_is_a_step():
  """Scout's llama3 scaling has low and high factors 1 and 1: wavelengths below 8,192 kept,
  longer ones divided by 16, no band between (no division by zero)."""
  from transformers_jax.modules.positions import rope_frequencies

  plain = rope_frequencies(128, 500000.0)
  got = rope_frequencies(128, 500000.0, "llama3:16,1,1,8192")
  long = 2 * np.pi / plain > 8192
  assert 0 < long.sum() < 64 and np.all(np.isfinite(got))
  np.testing.assert_allclose(got, np.where(long, plain / 16, plain), rtol=1e-6)


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(layer_types="chunked"), r"^model.attention_temperature_floor=4: it concerns NoPE"),
        (dict(qk_norm_kind="head"), r"^model.qk_norm_rope_only=True: only the parameter-free"),
        (
            dict(attention_temperature_floor=0, attention_temperature_scale=0.2),
            r"^model.attention_temperature_scale=0.2: only the temperature reads it",
        ),
        (dict(attention_temperature_floor=-1), r"^model.attention_temperature_floor=-1: must be"),
        (dict(use_bias=True), r"^model.moe_scale_input=True: an expert's biases"),
        (None, r"^model.moe_scale_input=True: only a mixture of experts reads it"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(experiment, changes, match):
  c = tiny(experiment)
  with pytest.raises(ValueError, match=match) as refused:
    c.replace(**changes) if changes else ModelConfig(moe_scale_input=True)
  assert "\n" not in str(refused.value)


def test_the_presets_count_as_transformers(experiment):
  """Scout's and Maverick's released counts (test_open_models' table holds them to the
  parameter); the tiny model's formula agrees with its shapes, and one routed expert per
  token leaves Maverick 17.18B active."""
  c = tiny(experiment)
  assert counting.count(c) == counting.analytic_count(c)
  maverick = experiment("llama4", "maverick").model
  active = counting.analytic_count(maverick, active=True)
  assert active == 17_184_691_200


@pytest.mark.parametrize(
    "changes,said",
    [
        (dict(attention_bias=True), "attention_bias=True"),
        (dict(moe_layers=[0, 3]), r"moe_layers \[0, 3\]"),
        (dict(no_rope_layers=[1, 0]), "no_rope_layers must give"),
        (dict(layer_types=["full_attention"] * 4), "layer_types"),
        (dict(interleave_moe_layer_step=5), "interleave_moe_layer_step=5"),
        (
            dict(
                rope_parameters=dict(
                    rope_type="yarn", factor=2.0, original_max_position_embeddings=8
                )
            ),
            "RoPE scaling 'yarn'",
        ),
    ],
)
def test_config_values_the_mapping_cannot_hold_are_one_line_naming_the_key(changes, said, tmp_path):
  import json

  from conftest import ROOT
  from transformers_jax.interop import UnsupportedArchitecture, load_hf

  config = json.loads((ROOT / "tests/fixtures/hf/llama4_text/config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps(dict(config, **changes)))
  with pytest.raises(UnsupportedArchitecture, match=said) as refused:
    load_hf(tmp_path)
  assert "\n" not in str(refused.value)


def test_an_export_llama_4_cannot_hold_is_refused_naming_the_field(experiment, tmp_path):
  """RoPE blocks both chunked and full, or a sliding window: one line naming the field."""
  from transformers_jax.interop import UnsupportedConfig, save_hf

  c = tiny(experiment, num_layers=2, layer_types="chunked,full,nope")
  params = nn.unbox(jax.jit(lambda k: init_params(c, k))(KEY))
  with pytest.raises(UnsupportedConfig, match="model.layer_types='chunked,full,nope' as Llama4"):
    save_hf(tmp_path, c.to_dict(), params)


def test_a_llama_4_population_member_trains_as_its_solo_run(experiment, tmp_path):
  """Two members (seeds) of llama4.py:tiny vmapped in one step, scanned in runs with remat:
  member 0's losses are its solo run's (the ragged input-scaled experts, chunks of 8 and the
  NoPE block's temperature over 32 tokens under the population's vmap). (That a population's
  --compile_only report counts every member's FLOPs, whatever the model, is test_population's.)"""
  import json

  from transformers_jax.train.entry import train

  def config(**fields):
    c = experiment("llama4", "tiny")
    c.update_from_flattened_dict(
        {"steps": 2, "batch_size": 2, "seq_len": 32, "log_every": 1, "eval_every": 100}
        | {"checkpoint_every": 100, "sample.max_new_tokens": 0, "model.scan_layers": True}
        | {"model.remat": "full", "eval_batches": 1, "device_peak_flops": 1e12, **fields}
    )
    return c

  def losses(workdir, member=None):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in rows if "loss" in x and x.get("member") == member]

  train(config(**{"population.seeds": 2}), tmp_path / "population")
  train(config(), tmp_path / "solo")
  np.testing.assert_allclose(losses(tmp_path / "population", 0), losses(tmp_path / "solo"), 1e-5)
  assert losses(tmp_path / "population", 1) != losses(tmp_path / "solo")
