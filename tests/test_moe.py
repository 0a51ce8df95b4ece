"""Mixture of experts (modules/feed_forward.py, modules/moe_ragged.py): the ragged
implementation equals the dense reference, its grouped matmuls equal jax.lax.ragged_dot, its
capacity drops the choices the reference drops, expert parallelism trains as one device does,
and the router losses reach the objective."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax.config import ModelConfig
from transformers_jax.modules import moe_ragged, moe_weights
from transformers_jax.modules.feed_forward import MoE

from conftest import run_worker

SMALL = dict(feed_forward="moe", num_experts=4, d_model=16, d_ff=32)


@functools.partial(jax.jit, static_argnums=0)
def _apply(c, params, x):
  """(a scalar of the output, (output, the sown collections)) of one MoE layer."""
  out, state = MoE(c).apply({"params": params}, x, mutable=["losses", "moe_stats"])
  probe = jnp.sin(jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape))
  return jnp.sum(out * probe), (out, state)


@functools.partial(jax.jit, static_argnums=0)  # one program rather than one per operation
def _params(c, x):
  params = MoE(c).init(jax.random.PRNGKey(1), x)["params"]
  # non-zero biases and a router far from uniform, so that both take part
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
  leaves = [p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(tree, leaves)


@pytest.mark.parametrize("top_k, activation, bias", [(1, "gelu", True), (2, "swiglu", False)])
def test_ragged_equals_dense_when_nothing_is_dropped(top_k, activation, bias):
  # capacity_factor = E / top_k: the dense reference has a slot for every token's choices
  c = ModelConfig(**SMALL, top_k=top_k, activation=activation, use_bias=bias, capacity_factor=4.0)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 16))
  params = _params(c, x)
  grad = jax.jit(jax.value_and_grad(_apply, argnums=(1, 2), has_aux=True), static_argnums=0)
  (_, (dense_out, dense_state)), dense_grads = grad(c, params, x)
  (_, (out, state)), grads = grad(c.replace(moe_impl="ragged"), params, x)
  assert float(dense_state["moe_stats"]["dropped_fraction"][0]) == 0.0
  assert float(state["moe_stats"]["dropped_fraction"][0]) == 0.0
  np.testing.assert_allclose(out, dense_out, rtol=1e-5, atol=1e-5)
  for g, dense_g in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(dense_grads)):
    np.testing.assert_allclose(g, dense_g, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      state["losses"]["moe_aux_loss"], dense_state["losses"]["moe_aux_loss"], rtol=1e-6
  )
  np.testing.assert_allclose(
      state["moe_stats"]["router_z_loss"], dense_state["moe_stats"]["router_z_loss"], rtol=1e-6
  )
  fraction = state["moe_stats"]["expert_fraction"][0]
  assert fraction.shape == (4,) and abs(float(jnp.sum(fraction)) - 1.0) < 1e-6


def test_ragged_capacity_drops_what_the_dense_reference_drops():
  # one sequence: the dense per-sequence capacity and the ragged per-device one are the same
  # number of slots, filled in the same order (first choices first, then in token order)
  c = ModelConfig(**SMALL, top_k=2, capacity_factor=0.5, activation="swiglu", use_bias=False)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 16, 16))
  params = _params(c, x)
  _, (dense_out, dense_state) = _apply(c, params, x)
  _, (out, state) = _apply(c.replace(moe_impl="ragged", moe_dropless=False), params, x)
  dropped = float(state["moe_stats"]["dropped_fraction"][0])
  assert dropped > 0.2  # half the slots the choices need: many are dropped
  assert dropped == pytest.approx(float(dense_state["moe_stats"]["dropped_fraction"][0]))
  np.testing.assert_allclose(out, dense_out, rtol=1e-5, atol=1e-5)


def test_blocked_grouped_matmul_equals_ragged_dot():
  # groups of 5, 0, 9 and 3 rows out of 20: an empty group, and 3 rows past the last group
  xs = jax.random.normal(jax.random.PRNGKey(0), (20, 8))
  sizes = jnp.array([5, 0, 9, 3], jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  weights = {
      "wi": jax.random.normal(keys[0], (4, 8, 12)) / 3,
      "wi_1": jax.random.normal(keys[1], (4, 8, 12)) / 3,
      "wo": jax.random.normal(keys[2], (4, 12, 8)) / 3,
      "bi": jax.random.normal(keys[3], (4, 12)),
  }
  blocked = jax.jit(lambda *a: moe_ragged.grouped_ffn_blocked(*a, jax.nn.silu, True, block=8))(
      xs, sizes, weights
  )
  reference = jax.jit(lambda *a: moe_ragged.grouped_ffn_ragged_dot(*a, jax.nn.silu, True))(
      xs, sizes, weights
  )
  np.testing.assert_allclose(blocked, reference, rtol=1e-5, atol=1e-5)
  assert not np.asarray(blocked[17:]).any()
  # row 6 is the second row of expert 2: its own expert's FFN
  h = jax.nn.silu(xs[6] @ weights["wi"][2] + weights["bi"][2]) * (xs[6] @ weights["wi_1"][2])
  np.testing.assert_allclose(blocked[6], h @ weights["wo"][2], rtol=1e-5, atol=1e-5)


def test_tpu_grouped_matmuls_equal_ragged_dot_with_gradients():
  # the TPU paths (megablox kernel in interpret mode here): one expert per scan step, and all
  # experts in one call; groups of 70, 0, 100 and 50 rows out of 256, so an empty group and 36
  # rows past the groups
  m, d = 256, 128
  xs = jax.random.normal(jax.random.PRNGKey(0), (m, d))
  sizes = jnp.array([70, 0, 100, 50], jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  weights = {
      "wi": jax.random.normal(keys[0], (4, d, d)) / 8,
      "wi_1": jax.random.normal(keys[1], (4, d, d)) / 8,
      "wo": jax.random.normal(keys[2], (4, d, d)) / 8,
      "bi": jax.random.normal(keys[3], (4, d)),
  }
  probe = jnp.sin(jnp.arange(m * d, dtype=jnp.float32).reshape(m, d))

  def streamed(xs, w):
    return moe_weights.streamed_expert_ffn(
        xs, sizes, w, jax.nn.silu, True, jnp.float32, (), interpret=True
    )

  def tpu_kernel(xs, w):  # all experts in one kernel call, the rows past the groups skipped
    return moe_ragged.grouped_ffn_ragged_dot(
        xs, sizes, w, jax.nn.silu, True, tpu=True, interpret=True
    )

  def reference(xs, w):
    return moe_ragged.grouped_ffn_ragged_dot(xs, sizes, w, jax.nn.silu, True)

  results = []
  for ffn in (streamed, tpu_kernel, reference):

    @jax.jit  # the output and the gradients as one program per path
    def out_and_grads(xs, w, ffn=ffn):
      def loss(xs, w):
        out = ffn(xs, w)
        return jnp.sum(out * probe), out

      (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(xs, w)
      return out, grads

    results.append(out_and_grads(xs, weights))
  ref_out, ref_grads = results.pop()
  for out, grads in results:
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    assert not np.asarray(out[220:]).any()
    for g, ref_g in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
      np.testing.assert_allclose(g, ref_g, rtol=1e-5, atol=1e-4)
    assert not np.asarray(grads[1]["wi"][1]).any()  # the empty group's expert: no gradient


@pytest.fixture(scope="module")
def parallel_runs():
  meshes = {
      "one": {"data": 1},
      "expert4_data2": {"data": 2, "expert": 4},
      "expert2_fsdp2_tensor2": {"data": 1, "fsdp": 2, "tensor": 2, "expert": 2},
  }
  return run_worker("moe_worker.py", {"steps": 5, "meshes": meshes}, devices=8)


@pytest.mark.parametrize("mesh", ["expert4_data2", "expert2_fsdp2_tensor2"])
def test_expert_parallel_training_equals_one_device(parallel_runs, mesh):
  one, split = parallel_runs["one"], parallel_runs[mesh]
  assert len(one["losses"]) == 5 and one["losses"][0] != one["losses"][-1]  # it trains
  np.testing.assert_allclose(split["losses"], one["losses"], rtol=1e-5)
  assert "all-to-all" in split["collectives"]  # tokens travel to their experts' devices
  assert "all-to-all" not in one["collectives"]
  for name, value in one["metrics"].items():
    assert split["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


def test_training_metrics_report_expert_load(parallel_runs):
  metrics = parallel_runs["one"]["metrics"]
  fractions = [metrics[f"moe_expert_fraction_{e}"] for e in range(4)]
  assert sum(fractions) == pytest.approx(1.0, abs=1e-5)
  assert len(set(fractions)) > 1  # per expert, not one figure four times
  assert metrics["moe_dropped_fraction"] == 0.0  # dropless
  # one layer: at least 1 (its minimum, at uniform routing), and log(Z)^2 > 0
  assert metrics["moe_aux_loss"] >= 1.0 and metrics["moe_router_z_loss"] > 0


def test_the_console_line_shows_the_router(parallel_runs, capsys):
  """A step's router metrics (not only metrics.jsonl's): load balance, z-loss, dropped share and
  the busiest expert against an even share."""
  from transformers_jax.train.events import Progress

  one = parallel_runs["one"]
  metrics = {**one["metrics"], "loss": one["losses"][-1], "accuracy": 0.5, "tokens_per_s": 1e3}
  Progress(0, 5).update(5, metrics, "2 steps/s")
  line = capsys.readouterr().out.strip()
  busiest = max(metrics[f"moe_expert_fraction_{e}"] for e in range(4))
  assert line.startswith(f"step 5/5: loss {one['losses'][-1]:.4f} acc 0.500; router aux ")
  assert f"aux {metrics['moe_aux_loss']:.3f}, z {metrics['moe_router_z_loss']:.2f}" in line
  assert f"dropped 0.0%, busiest expert {busiest:.1%} (even 25.0%)" in line
  assert line.endswith("| 1,000 tok/s, 2 steps/s")


def test_moe_impl_is_validated():
  with pytest.raises(ValueError, match=r"^model.moe_impl='grouped': choose one of dense, ragged"):
    ModelConfig(**SMALL, moe_impl="grouped")


def test_router_losses_enter_the_objective_with_their_weights(experiment):
  from transformers_jax.models import build_model
  from transformers_jax.tasks import task_for
  from transformers_jax.train.step import make_loss_fn

  config = experiment("mixtral", "tiny")
  c = ModelConfig.from_dict(config.model).replace(num_layers=1)
  task = task_for(c)
  batch = {"tokens": task.synthetic_batch(c, config)["tokens"][:2, :9]}  # 8 inputs, 8 targets
  # jitted: one program rather than a compilation per operation of the init
  params = jax.jit(build_model(c).init)(jax.random.PRNGKey(0), jnp.asarray(batch["tokens"][:, :8]))
  rng = jax.random.PRNGKey(1)

  @jax.jit
  def objective(aux, z):  # the weights traced: one compile for the three pairs
    return make_loss_fn(task, c, 0.0, aux, moe_router_z_weight=z)(params["params"], batch, rng)

  base, sums = objective(0.0, 0.0)
  assert float(sums["aux"]) > 0 and float(sums["router_z"]) > 0
  np.testing.assert_allclose(objective(0.5, 0.0)[0] - base, 0.5 * sums["aux"], rtol=1e-4)
  np.testing.assert_allclose(objective(0.0, 0.25)[0] - base, 0.25 * sums["router_z"], rtol=1e-4)
