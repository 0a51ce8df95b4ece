"""DeepSeek-V2/V3 in the one Block (experiments/deepseek.py): multi-head latent attention and its
latent cache, DeepSeek's routing and its auxiliary-loss-free bias, the first blocks dense in
scanned runs, and the multi-token prediction objective. The Hugging Face fixture
(tests/test_interop.py, test_open_models.py) holds logits and greedy tokens to transformers'."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from conftest import ROOT, run_worker, shaken
from transformers_jax import decode
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, counting, init_params, lora
from transformers_jax.modules import moe_routing
from transformers_jax.modules.block import loop_to_scan, relayout, scan_to_loop, stacked_blocks

KEY = jax.random.PRNGKey(0)


def tiny(experiment, **changes):
  config = experiment("deepseek", "tiny")
  return config, ModelConfig.from_dict(config.model).replace(**changes)


def perturbed(c, scale=0.3):
  """Initial parameters shaken, and the routers' bias drawn, so every part acts."""
  return shaken(nn.unbox(jax.jit(lambda k: init_params(c, k))(KEY)), scale)


def test_latent_attention_decodes_from_its_latent_cache_as_the_forward_pass(experiment):
  """Scanned in two runs (the dense first block, then the MoE ones) the model computes what it
  does looped; decoding, a prefill and then one token at a time with the absorbed form over a
  cache of one latent per token and layer, gives the forward pass's logits."""
  _, c = tiny(experiment, mtp_depth=0, moe_impl="ragged")
  params = perturbed(c)
  tokens = jax.random.randint(KEY, (2, 9), 0, c.vocab_size)
  want = jax.jit(build_model(c).apply)({"params": params}, tokens)["logits"]
  scanned_c, scanned = c.replace(scan_layers=True), loop_to_scan(params)
  assert set(scanned["decoder"]) == {"layers", "layers_from_1"} and stacked_blocks(scanned)
  assert jax.tree_util.tree_all(
      jax.tree_util.tree_map(np.array_equal, scan_to_loop(scanned), params)
  )
  back = relayout(scanned, jax.eval_shape(lambda: params))
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, back, params))
  model = build_model(scanned_c, decode=True)
  cache = decode.init_cache(model, jnp.zeros((2, 9), jnp.int32))
  width = c.kv_lora_rank + c.qk_rope_head_dim  # the latent and the shared rotated key
  shapes = {a.shape for a in jax.tree_util.tree_leaves(cache) if a.ndim > 1}
  assert shapes == {(1, 2, 1, 9, width), (2, 2, 1, 9, width)}  # [run, B, 1, L, C + R]
  step = jax.jit(lambda p, cache, x: model.apply({"params": p, "cache": cache}, x, mutable=True))
  got = []
  for x in (tokens[:, :5], *(tokens[:, t : t + 1] for t in range(5, 9))):
    out, state = step(scanned, cache, x)
    cache = state["cache"]
    got.append(out["logits"])
  np.testing.assert_allclose(np.concatenate(got, axis=1), want, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("impl", ["flash", "fused"])
def test_values_wider_than_the_keys_reach_every_kernel(experiment, impl):
  """Values wider than queries and keys (both zero-padded to one head width): every attention
  implementation gives einsum's output, without RoPE (an encoder's learned positions)."""
  _, c = tiny(experiment, mtp_depth=0)
  c = c.replace(
      family="encoder",
      head="pooler",
      positions="learned",
      qk_rope_head_dim=0,
      rope_scaling="",
      v_head_dim=24,
      num_layers=2,
  )
  assert counting.count(c) == counting.analytic_count(c)
  params = perturbed(c, 0.1)
  tokens = jax.random.randint(KEY, (2, 16), 0, c.vocab_size)
  outs = [
      jax.jit(build_model(c.replace(attention_impl=i)).apply)({"params": params}, tokens)["hidden"]
      for i in ("einsum", impl)
  ]
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_routing_by_groups_with_the_bias_for_choosing_only(experiment):
  """Sigmoid scores; the 2 experts per token come from the best group (by its two best scores
  plus bias); the bias moves the choice, never the weights; weights unnormalised times 2.5."""
  _, c = tiny(experiment, router_norm_topk=False)
  logits = jnp.asarray([[2.0, -1.0, 1.0, 0.0, 1.5, 0.5, -2.0, 0.2]])
  scores = moe_routing.router_scores(c, logits)  # group 0's best two sum 0.88 + 0.73 = 1.61,
  weights, experts = moe_routing.choose(c, scores)  # group 1's 0.82 + 0.62 = 1.44
  assert sorted(experts[0].tolist()) == [0, 2]
  np.testing.assert_allclose(weights[0], 2.5 * jax.nn.sigmoid(logits[0, experts[0]]), rtol=1e-6)
  bias = jnp.asarray([0, 0, 0, 0, 0, 0.3, 0, 0])  # group 1 now: 0.82 + 0.92 = 1.74
  weights, experts = moe_routing.choose(c, scores, bias)
  assert sorted(experts[0].tolist()) == [4, 5]
  np.testing.assert_allclose(weights[0], 2.5 * jax.nn.sigmoid(logits[0, experts[0]]), rtol=1e-6)


def test_the_update_body_moves_the_routers_bias_against_the_load(experiment):
  """One update: the bias moves by gamma towards the experts below the mean load and away from
  those above it; it is no trained parameter (no gradient, no optimizer state); the rest
  trains."""
  from transformers_jax.tasks import task_for
  from transformers_jax.train import optim
  from transformers_jax.train.step import make_update

  config, c = tiny(experiment, num_layers=2, mtp_depth=0)
  config.unlock()
  config.model = ml_dict(c)
  config.batch_size, config.seq_len, config.task, config.warmup_steps = 4, 16, "lm", 0
  params = perturbed(c, 0.1)
  tx = optim.make_optimizer(config)
  opt_state = tx.init(params)
  assert not any(
      "e_score_correction_bias" in jax.tree_util.keystr(p)
      for p, _ in jax.tree_util.tree_flatten_with_path(opt_state)[0]
  )
  assert moe_routing.BIAS not in json.dumps(jax.tree_util.tree_map(str, lora.trainable(params, c)))
  task = task_for(c, config)
  update = jax.jit(make_update(task, c, config, lambda _: tx))
  batch = task.synthetic_batch(c, config)
  new, _, metrics = update(params, opt_state, batch, KEY, optim.config_hparams(config))
  loads = np.asarray([metrics[f"moe_expert_fraction_{e}"] for e in range(c.num_experts)])
  moved = np.asarray(new["decoder"]["layer_1"]["ffn"][moe_routing.BIAS])
  before = np.asarray(params["decoder"]["layer_1"]["ffn"][moe_routing.BIAS])
  step = c.moe_bias_speed * np.sign(loads.mean() - loads)
  np.testing.assert_allclose(moved - before, step, atol=1e-6)
  assert np.any(moved != before)
  kernel = ("decoder", "layer_1", "ffn", "router", "kernel")
  assert not np.array_equal(_at(new, kernel), _at(params, kernel))


def _at(tree, path):
  for key in path:
    tree = tree[key]
  return np.asarray(tree)


def ml_dict(c):
  import ml_collections

  return ml_collections.ConfigDict(c.to_dict())


def test_multi_token_prediction_adds_its_weighted_losses_within_documents(experiment):
  """The mtp objective's loss is the next-token loss plus lambda / D times each depth's summed
  cross-entropy; a depth counts a position only when the token it predicts lies in the same
  document; its gradient reaches the modules' parameters."""
  from transformers_jax.tasks import TASKS
  from transformers_jax.tasks.mtp import depth_weights

  weights = jnp.asarray([[1.0, 1, 0, 1, 1, 1]])  # a document ends after position 1
  np.testing.assert_array_equal(depth_weights(weights, 1), [[1, 0, 0, 1, 1, 0]])
  np.testing.assert_array_equal(depth_weights(weights, 2), [[0, 0, 0, 1, 0, 0]])
  config, c = tiny(experiment)
  task = TASKS["mtp"]
  params = perturbed(c, 0.05)
  tokens = jax.random.randint(KEY, (2, 13), 0, c.vocab_size)
  batch = {"tokens": tokens}
  model = build_model(c)

  def loss(p, weight):
    outputs, _ = task.outputs(model, {"params": p}, batch, {}, [])
    options = dict(task.loss_options(config), mtp_weight=weight)
    return task.loss(outputs, batch, c, options)

  @jax.jit
  def both(p):
    def objective(p):
      sums = loss(p, 0.3)
      return sums["loss"], sums

    (_, sums), grads = jax.value_and_grad(objective, has_aux=True)(p)
    return sums, loss(p, 0.0)["loss"], grads

  sums, plain, grads = both(params)
  np.testing.assert_allclose(sums["loss"], plain + 0.3 * sums["mtp_nll_1"], rtol=1e-5)
  assert float(sums["mtp_weight_1"]) == 2 * 11  # the last position of each row has no target
  assert all(np.any(g) for g in jax.tree_util.tree_leaves(grads["mtp"]["depth_0"]["proj"]))


def test_expert_parallel_deepseek_training_equals_one_device():
  """Latent attention, shared experts, grouped sigmoid routing with the bias and multi-token
  prediction under fsdp x tensor x expert and context x expert meshes: the one-device run's
  losses and routers' bias. One block, an MoE one (the multi-token prediction's block is a
  second): a dense first block splits over the meshes as any dense block does."""
  meshes = {
      "one": {"data": 1},
      "fsdp2_tensor2_expert2": {"data": 1, "fsdp": 2, "tensor": 2, "expert": 2},
      "context2_expert2": {"data": 2, "context": 2, "expert": 2},
  }
  spec = {"steps": 3, "meshes": meshes, "experiment": "deepseek.py:tiny", "num_layers": 1}
  spec["model"] = {"moe_first_dense": 0}
  runs = run_worker("moe_worker.py", spec, devices=8)
  one = runs.pop("one")
  assert one["bias"] and np.any(np.asarray(one["bias"]))  # it moved
  for name, run in runs.items():
    np.testing.assert_allclose(run["losses"], one["losses"], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(run["bias"], one["bias"], atol=1e-7, err_msg=name)
    assert "all-to-all" in run["collectives"], name


def test_settings_that_cannot_work_are_refused_in_one_line(experiment, tmp_path):
  from transformers_jax.interop import UnsupportedArchitecture, load_hf

  _, c = tiny(experiment)
  for changes, words in (
      (dict(num_kv_heads=2), "model.num_kv_heads=2"),
      (dict(positions="learned", rope_scaling=""), "model.qk_rope_head_dim=8"),
      (dict(moe_top_groups=3), "model.moe_top_groups=3"),
      (dict(feed_forward="dense"), "model.num_shared_experts=1"),
      (dict(family="encoder", head="pooler"), "model.mtp_depth=1"),
      (dict(rope_scaling="yarn:40,4096"), "model.rope_scaling='yarn:40,4096'"),
  ):
    with pytest.raises(ValueError, match=words) as e:
      c.replace(**changes)
    assert "\n" not in str(e.value)
  d = shutil.copytree(ROOT / "tests" / "fixtures" / "hf" / "deepseek_v3", tmp_path / "m")
  config = json.loads((d / "config.json").read_text())
  for key, value in (("rope_interleave", False), ("num_key_value_heads", 2)):
    (d / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(UnsupportedArchitecture, match=key) as e:
      load_hf(d)
    assert "\n" not in str(e.value)


def test_the_hubs_multi_token_prediction_layer_round_trips(tmp_path):
  """A model with an MTP module is written as the hub's files hold DeepSeek-V3's: one more
  `layers.<L>` with its enorm, hnorm, eh_proj, block and shared_head.norm, and copies of the
  embedding and head; reading it back gives model.mtp_depth=1 and the same parameters."""
  from safetensors.numpy import load_file

  from transformers_jax.interop import load_hf, save_hf
  from transformers_jax.models import param_shapes

  fields, params = load_hf(ROOT / "tests" / "fixtures" / "hf" / "deepseek_v3")
  c = ModelConfig(**fields).replace(mtp_depth=1)
  rng = np.random.default_rng(0)
  mtp = jax.tree_util.tree_map(
      lambda s: rng.standard_normal(s.shape).astype(np.float32), param_shapes(c)["mtp"]
  )
  save_hf(tmp_path, c, {**params, "mtp": mtp})
  written = load_file(tmp_path / "model.safetensors")
  np.testing.assert_array_equal(
      written["model.layers.3.embed_tokens.weight"], written["model.embed_tokens.weight"]
  )
  np.testing.assert_array_equal(
      written["model.layers.3.shared_head.head.weight"], written["lm_head.weight"]
  )
  assert "model.layers.3.eh_proj.weight" in written and "model.layers.3.mlp.gate.weight" in written
  again, back = load_hf(tmp_path)
  assert again["mtp_depth"] == 1
  want = dict(jax.tree_util.tree_leaves_with_path({**params, "mtp": mtp}))
  got = dict(jax.tree_util.tree_leaves_with_path(back))
  assert want.keys() == got.keys()
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value)
