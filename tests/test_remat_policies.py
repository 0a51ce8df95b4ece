"""model.remat by name (modules/remat.py): every policy computes the gradients of no remat, and
the names a policy keeps are the ones the block tags."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import initializer
from transformers_jax.modules import remat
from transformers_jax.tasks import task_for
from transformers_jax.train.step import make_loss_fn

BASE = ModelConfig(
    family="decoder", num_layers=2, d_model=32, num_heads=4, vocab_size=128, max_len=16
)
POLICIES = [
    ("minimal", ""),
    ("save_dot_except_mlpwi", ""),
    ("save_dot_except_mlp", ""),
    ("save_dot_with_context_except_mlp", ""),
    ("save_qkv_proj", ""),
    ("save_out_proj", ""),
    ("custom", "qkv_proj:offload,out_proj:device,mlpwi:remat,norm:device"),
]


def losses_and_grads(cfg, steps=3):
  params = nn.unbox(
      jax.jit(initializer(cfg.replace(remat="none", remat_save="")))(jax.random.PRNGKey(0))
  )
  loss_fn = make_loss_fn(task_for(cfg), cfg, {"label_smoothing": 0.0}, 0.0)
  batch = {"tokens": jax.random.randint(jax.random.PRNGKey(1), (4, 17), 0, 128)}
  value_and_grad = jax.value_and_grad(lambda p: loss_fn(p, batch, jax.random.PRNGKey(2))[0])

  @jax.jit  # the SGD update too: op by op, each leaf's shape would compile its own programs
  def step(params):
    loss, g = value_and_grad(params)
    return loss, g, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)

  losses = []
  for _ in range(steps):
    loss, g, params = step(params)
    losses.append(float(loss))
  return losses, g


@pytest.fixture(scope="module")
def reference():
  return {scan: losses_and_grads(BASE.replace(scan_layers=scan)) for scan in (False, True)}


# every policy on the looped stack, two of them on the scanned one as well
CASES = [(p, s, False) for p, s in POLICIES] + [(p, s, True) for p, s in POLICIES[::6]]


@pytest.mark.parametrize(
    "policy,save,scan", CASES, ids=[f"{p}-{'scan' if s else 'loop'}" for p, _, s in CASES]
)
def test_every_policy_gives_the_gradients_of_no_remat(reference, policy, save, scan):
  cfg = BASE.replace(remat=policy, remat_save=save, scan_layers=scan)
  losses, grads = losses_and_grads(cfg)
  want_losses, want_grads = reference[scan]
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(want_grads))
  for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale)


def test_the_block_tags_every_name_the_policies_keep():
  """The names in the block's forward computation (its jaxpr) are the table's; a gated FFN's
  two input projections and a mixture of experts' dispatch and combine among them."""
  from transformers_jax.models import build_model, example_inputs

  def names_in(cfg):
    model = build_model(cfg)
    params = jax.eval_shape(initializer(cfg), jax.random.PRNGKey(0))
    jaxpr = jax.make_jaxpr(lambda p, x: model.apply({"params": nn.unbox(p)}, x))(
        params, *example_inputs(cfg)
    )
    return set(re.findall(r"\bname\[name=(\w+)\]", str(jaxpr)))

  plain = names_in(BASE)
  assert plain == {
      *("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi", "mlpwo", "norm")
  }
  gated_moe = names_in(BASE.replace(activation="swiglu", feed_forward="moe", num_experts=2))
  assert {"mlpwi_0", "mlpwi_1", "moe_dispatch", "moe_combine"} <= gated_moe
  for saved in remat.SAVED.values():
    assert set(saved) <= set(remat.NAMES)


def test_remat_settings_are_refused_in_one_line():
  for fields, said in (
      (dict(remat="custom", remat_save="qkv:device"), "remat_save"),
      (dict(remat="custom", remat_save="qkv_proj:disk"), "actions device, offload, remat"),
      (dict(remat="custom", remat_save=""), "remat_save"),
      (dict(remat="full", remat_save="qkv_proj:device"), "model.remat=custom only"),
      (dict(remat="minimum"), "choose one of"),
  ):
    with pytest.raises(ValueError, match=said):
      BASE.replace(**fields)
