"""μP and CompleteP (model.parametrization, modules/parametrization.py): the coordinate check
on two widths (flat under mup, not under sp), the base width equal to sp, the per-tensor Adam
rates, CompleteP's residual-branch factor, counts unchanged, every family and placement built,
and the bad settings refused with one error line."""

import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from transformers_jax.models import ModelConfig, build_model, counting, initializer
from transformers_jax.modules import parametrization
from transformers_jax.modules.parametrization import role_of
from transformers_jax.modules.placement_base import Init
from transformers_jax.modules.placements import PLACEMENTS

from conftest import ROOT, load_script

coord = load_script("coord_check")
KEY = jax.random.PRNGKey(0)


def test_coordinate_check_is_flat_under_mup_and_grows_under_sp():
  result = coord.coord_check("decoder", [16, 64], depth=2, steps=2, seeds=1, lr=1e-2)
  assert result["mup"]["flat"], result["mup"]["spread"]
  assert max(result["mup"]["spread"].values()) <= coord.FLAT
  assert not result["sp"]["flat"]
  assert max(result["sp"]["spread"].values()) > 2 * coord.FLAT  # not a near miss


def tiny(parametrization="mup", width=32, base=16, **kw):
  fields = dict(d_model=width, num_heads=2, num_layers=2, vocab_size=64, max_len=16)
  fields.update(parametrization=parametrization, **kw)
  if parametrization != "sp":
    fields["mup_base_width"] = base
  return ModelConfig(**fields)


def adam_update(c, lr=1e-2):
  """The first AdamW update of `c`'s parameters on one batch (the project's optimizer)."""
  optimizer = coord.optim.make_optimizer(coord.train_config(c, lr, 1))
  model, params = build_model(c), nn.unbox(initializer(c)(KEY))
  tokens = jax.random.randint(KEY, (2, 16), 0, c.vocab_size)
  loss = coord.loss_fn(model, c.family)
  grads = jax.grad(loss)(params, tokens, tokens[:, 1:])
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  return params, updates


def test_at_the_base_width_mup_is_sp_and_wider_hidden_tensors_take_rate_over_m():
  sp_params, sp_updates = adam_update(tiny("sp"))
  same_params, same_updates = adam_update(tiny("mup", base=32))
  for a, b in zip(
      jax.tree.leaves((sp_params, sp_updates)), jax.tree.leaves((same_params, same_updates))
  ):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
  # width 32 over base 8: m = 4; Adam's first step moves each coordinate by about its rate
  params, updates = adam_update(tiny("mup", base=8))
  hidden = jnp.max(jnp.abs(updates["decoder"]["layer_0"]["ffn"]["wi"]["kernel"]))
  table = jnp.max(jnp.abs(updates["embed"]["token_embed"]["embedding"]))
  np.testing.assert_allclose(hidden, 1e-2 / 4, rtol=0.05)
  np.testing.assert_allclose(table, 1e-2, rtol=0.05)
  # hidden init std / sqrt(m), the token table's as at the base
  std = float(jnp.std(params["decoder"]["layer_0"]["ffn"]["wi"]["kernel"]))
  assert math.isclose(std, 0.02 / 2, rel_tol=0.1), std
  assert math.isclose(
      float(jnp.std(params["embed"]["token_embed"]["embedding"])), 0.02, rel_tol=0.1
  )


def test_roles_from_logical_axes():
  assert role_of(("embed", "heads", "head_dim")) == "hidden"
  assert role_of(("layers", "experts", "embed", "mlp")) == "hidden"
  assert role_of(("vocab", "embed")) == "input"
  assert role_of(("embed", "vocab")) == "readout"
  assert role_of(("embed", "experts")) == "output"  # a router
  assert role_of(("heads", "head_dim"), "bias") == "vector"
  # the experts' biases [E, 1, width]: the size-1 axis only broadcasts
  assert role_of(("experts", None, "mlp"), "bi", (4, 1, 64)) == "vector"
  assert role_of(("embed", None), "kernel", (64, 8)) == "output"  # a fixed-rank down-projection


@pytest.mark.parametrize(
    "role, names, shape, variance",
    [  # Table 3 against the base (width 16): input and readout as there, output / m^2
        ("input", ("patch", "embed"), (48, 64), 2 / (48 + 16)),
        ("readout", ("embed", "classes"), (64, 10), 2 / (16 + 10)),
        ("output", ("embed", "experts"), (64, 4), 2 / (16 + 4) / 16),
        ("hidden", ("embed", "mlp"), (64, 256), 2 / (64 + 256)),  # Xavier's own 1/m
    ],
)
def test_xavier_under_mup_keeps_the_base_width_variance(role, names, shape, variance):
  c = tiny("mup", width=64, base=16, init="xavier")  # m = 4
  rule = parametrization.kernel_rule(c, names, Init("normal", 1.0))
  assert role_of(names) == role
  # 64 kernels at once (a batch axis, not a fan) so the sample variance is within a few %
  kernels = rule.initializer(batch_axis=(0,))(KEY, (64, *shape))
  np.testing.assert_allclose(float(jnp.var(kernels)), variance, rtol=0.05)


def test_complete_p_scales_each_residual_branch_by_base_over_depth():
  """Parallel blocks (x + sum f_i(N(x))): the first block's change to the stream is exactly
  base / depth of μP's, from the same parameters."""
  mup = tiny("mup", norm_placement="parallel", num_layers=4)
  complete = tiny("complete_p", norm_placement="parallel", num_layers=4, mup_base_depth=1)
  params = nn.unbox(initializer(mup)(KEY))
  tokens = jax.random.randint(KEY, (2, 16), 0, 64)

  def first_block_change(c):
    keep = lambda m, name: type(m).__name__ in ("Block", "Embedder") and name == "__call__"  # noqa: E731
    _, state = build_model(c).apply(
        {"params": params}, tokens, capture_intermediates=keep, mutable=["intermediates"]
    )
    found = state["intermediates"]
    return found["decoder"]["layer_0"]["__call__"][0] - found["embed"]["__call__"][0]

  np.testing.assert_allclose(first_block_change(complete), first_block_change(mup) / 4, atol=1e-6)


def test_counts_unchanged_and_every_family_and_placement_builds_under_complete_p():
  base = dict(mup_base_depth=2, num_layers=2)
  for family, extra in (
      ("decoder", {}),
      ("encoder", {"head": "mlm"}),
      ("encoder_decoder", {}),
      ("vit", {"image_size": 8, "patch_size": 4, "num_classes": 3}),
  ):
    c = tiny("complete_p", family=family, **base, **extra)
    assert counting.count(c) == counting.count(tiny("sp", family=family, num_layers=2, **extra))
    for scan in (False, True):
      jax.eval_shape(initializer(c.replace(scan_layers=scan)), KEY)
  for name, placement in PLACEMENTS.items():
    if placement.unavailable:
      continue
    c = tiny("complete_p", norm_placement=name, **base)
    params = nn.unbox(jax.eval_shape(initializer(c), KEY))
    apply = lambda p, c=c: build_model(c).apply({"params": p}, jnp.zeros((1, 8), jnp.int32))  # noqa: E731
    jax.eval_shape(apply, params)


@pytest.mark.parametrize(
    "settings, said",
    [
        ({"parametrization": "mup"}, "model.mup_base_width=0"),
        ({"parametrization": "mup", "mup_base_width": 128}, "larger than model.d_model=32"),
        (
            {"parametrization": "complete_p", "mup_base_width": 16, "mup_base_depth": 3},
            "not a whole multiple",
        ),
    ],
)
def test_bad_settings_are_refused(settings, said):
  with pytest.raises(ValueError, match=said):
    ModelConfig(d_model=32, num_heads=2, num_layers=2, **settings)


def test_the_command_line_refuses_mup_without_a_base_width_in_one_line(tmp_path):
  out = subprocess.run(
      [
          sys.executable,
          "-m",
          "transformers_jax.train",
          f"--config={ROOT}/experiments/gpt2.py:tiny",
          f"--workdir={tmp_path}/run",
          "--config.model.parametrization=mup",
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
  )
  lines = [x for x in out.stderr.splitlines() if x.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stderr
  assert lines[0].startswith("error: model.mup_base_width=0")
  run = tmp_path / "run"  # nothing written (the run's folder, if made, left empty)
  assert not run.exists() or not any(run.iterdir())


def test_optax_groups_see_the_right_rates():
  """optax.multi_transform's groups: every hidden kernel at rate / m, the rest at the rate."""
  c = tiny("mup", base=8)
  groups = coord.optim.tensor_groups(c)
  assert groups["['decoder']['layer_1']['self_attn']['query']['kernel']"][0] == 0.25
  assert groups["['decoder']['layer_1']['self_attn']['query']['bias']"][0] == 1.0
  assert groups["['embed']['pos_embed']['embedding']"][0] == 1.0
  assert isinstance(
      coord.optim.make_optimizer(coord.train_config(c, 1e-3, 1)), optax.GradientTransformation
  )


def test_complete_p_groups_the_experts_biases_with_the_vectors(experiment):
  """gpt-oss's expert biases [E, 1, width] are vectors (epsilon / l), its experts hidden, its
  router an output tensor (rate / m)."""
  fields = dict(experiment("gpt_oss", "tiny").model)  # d_model 64, 2 blocks
  fields.update(parametrization="complete_p", mup_base_width=32, mup_base_depth=1)
  groups = coord.optim.tensor_groups(ModelConfig.from_dict(fields))
  ffn = "['decoder']['layer_0']['ffn']"
  for bias in ("bi", "bi_1", "bo"):
    assert groups[f"{ffn}['{bias}']"] == (1.0, 0.5, 1.0)
  assert groups[f"{ffn}['wi']"] == (0.5, 0.25, 2.0)  # rate / m, epsilon / (m l), decay x m
  assert groups[f"{ffn}['router']['kernel']"] == (0.5, 1.0, 1.0)
