"""One registry per kind: position schemes (score biases among them), norm kinds, activations,
feed-forward kinds and objectives are each a table of entries, and the tests here read the
tables, so that a new entry is covered without new test code. Each kind's last test registers a
toy entry written here (monkeypatch.setitem) and runs it through the same checks: the counts
exact (models/counting.py's analytic count and breakdown against eval_shape), a few training
steps finite, scanned blocks equal to looped ones, its summary listed by --config_help; an
objective's batch shapes, its loss on a synthetic batch and its fields in --config_help."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax import config_reference
from transformers_jax.config import registries
from transformers_jax.models import build_model, counting, initializer
from transformers_jax.modules.activations import ACTIVATIONS, Activation
from transformers_jax.modules.attention import attend
from transformers_jax.modules.block import loop_to_scan
from transformers_jax.modules.common import summary_of
from transformers_jax.modules.feed_forward import FEED_FORWARDS, FeedForwardKind
from transformers_jax.modules.norm_kinds import NormKind
from transformers_jax.modules.norms import NORM_KINDS
from transformers_jax.modules.positions import (
    POSITION_SCHEMES,
    PositionScheme,
    ScoreBias,
    alibi_slopes,
    bias_param,
    sinusoidal_table,
)
from transformers_jax.tasks import TASKS, Task, TaskData
from transformers_jax.train_config import experiment_config

from conftest import assert_close, load_script

KEY = jax.random.PRNGKey(0)
tiny = load_script("norm_zoo_grid").tiny_config  # 2 blocks per stack, d_model 8
loss_of = load_script("norm_zoo_grid").loss_of


def check_model(c, steps: int = 3):
  """The checks every entry's model passes: analytic count and breakdown equal to eval_shape's,
  looped and scanned; `steps` SGD steps with a finite loss, the scanned blocks' loss equal to
  the looped ones' at every step (one program: the looped loss and gradient, the scanned
  loss)."""
  for scan in (False, True):
    layout = c.replace(scan_layers=scan)
    shapes = nn.unbox(jax.eval_shape(initializer(layout), KEY))
    held = sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))
    assert counting.analytic_count(layout) == held
    assert counting.tree_breakdown(shapes, layout) == counting.analytic_breakdown(layout)
  looped, scanned = loss_of(c.replace(scan_layers=False)), loss_of(c.replace(scan_layers=True))

  @jax.jit
  def step(params):
    loss, grads = jax.value_and_grad(looped)(params)
    trained = jax.tree_util.tree_map(lambda p, g: p - 0.3 * g, params, grads)
    return loss, scanned(loop_to_scan(params)), trained

  params = nn.unbox(initializer(c.replace(scan_layers=False))(KEY))
  for _ in range(steps):
    loss, scanned_loss, params = step(params)
    assert np.isfinite(float(loss))
    np.testing.assert_allclose(float(scanned_loss), float(loss), rtol=1e-5)


def check_listed(field: str, name: str):
  """The entry's one-line summary, listed under its field by --config_help and in the docs'
  tables."""
  summary = summary_of(registries()[field][name])
  assert summary and "\n" not in summary
  assert f"        {name}: {summary}" in config_reference.help_text(experiment_config())
  assert f"| `{name}` |" in config_reference.entry_table(f"model.{field}")


@pytest.mark.parametrize("field", sorted(registries()))
def test_every_entry_of_every_registry_has_a_summary_listed_by_config_help(field):
  text = config_reference.help_text(experiment_config())
  for name, entry in registries()[field].items():
    summary = summary_of(entry)
    assert summary and "\n" not in summary, (field, name)
    assert f"        {name}: {summary}" in text


# ----------------------------------------------------------------------------- position schemes
def check_position_scheme(name: str):
  """Both stacks of an encoder-decoder (a causal one with cross-attention, a bidirectional one)
  and their embedder."""
  check_model(tiny("encoder_decoder", "pre", positions=name))


@pytest.mark.parametrize("name", list(POSITION_SCHEMES))
def test_every_position_scheme_counts_trains_and_scans(name):
  check_position_scheme(name)


class BiasedAttention(nn.Module):
  """Attention with the score bias a scheme makes in this module's scope (as a stack would)."""

  cfg: object
  causal: bool
  impl: str

  @nn.compact
  def __call__(self, q, k, v):
    bias = POSITION_SCHEMES[self.cfg.positions].score_bias(self.cfg, self, self.causal)
    return attend(q, k, v, None, self.causal, impl=self.impl, block_q=16, block_kv=16, bias=bias)


def check_score_bias(name: str):
  """Flash (block by block, the bias's weights' gradient accumulated per block) equals einsum,
  causal and bidirectional, outputs and the gradients of q, k, v and the weights, at 40 keys
  (not a multiple of the 16-key blocks)."""
  c = tiny("decoder", "pre", positions=name)
  keys = jax.random.split(KEY, 4)
  q, k, v, cot = (jax.random.normal(key, (2, 40, 2, 4)) for key in keys)
  params = {
      causal: BiasedAttention(c, causal, "einsum").init(KEY, q, k, v) for causal in (True, False)
  }

  @jax.jit
  def run(params, q, k, v):
    out = {}
    for causal in (True, False):
      for impl in ("einsum", "flash"):
        f = lambda p, q, k, v: BiasedAttention(c, causal, impl).apply(p, q, k, v)  # noqa: B023
        y, vjp = jax.vjp(f, params[causal], q, k, v)
        out[causal, impl] = (y, vjp(cot))
    return out

  out = run(params, q, k, v)
  for causal in (True, False):
    for a, b in zip(*(jax.tree_util.tree_leaves(out[causal, i]) for i in ("flash", "einsum"))):
      assert_close(a, b)


@pytest.mark.parametrize(
    "name", [name for name, scheme in POSITION_SCHEMES.items() if scheme.has_score_bias]
)
def test_every_score_bias_takes_the_flash_path_as_einsum(name):
  check_score_bias(name)


class ScaledSinusoids(PositionScheme):
  """The 2017 sinusoids, times a learned scalar per position: a scheme written in a test."""

  summary = "sinusoids times a learned scalar per position (written in a test)"

  def embedding_table(self, c):
    return nn.Embed(c.seq_len_max, 1, embedding_init=nn.initializers.ones)

  def add_to_embeddings(self, c, x, positions, table):
    waves = jnp.asarray(sinusoidal_table(c.seq_len_max, c.d_model), x.dtype)[positions]
    return x + table(positions).astype(x.dtype) * waves


class LearnedSlopes(PositionScheme):
  """ALiBi whose per-head slopes are learned (from ALiBi's): a score bias written in a test."""

  summary = "-slope_h * |query - key| with learned slopes (written in a test)"

  def score_bias(self, c, stack, causal):
    init = lambda key, shape, dtype: jnp.asarray(alibi_slopes(shape[0]), dtype)
    slopes = bias_param(stack, c, "slope_bias", init, (c.num_heads,))
    return ScoreBias(slopes, c.positions, not causal)

  def bias_scores(self, bias, relative):
    distance = jnp.abs(relative).astype(jnp.float32)[:, None]
    return -bias.weights.astype(jnp.float32)[None, :, None, None] * distance


def test_a_new_position_scheme_is_one_registry_entry(monkeypatch):
  monkeypatch.setitem(POSITION_SCHEMES, "scaled_sinusoids", ScaledSinusoids())
  check_position_scheme("scaled_sinusoids")
  check_listed("positions", "scaled_sinusoids")
  c = tiny("encoder_decoder", "pre", positions="scaled_sinusoids")
  assert counting.analytic_breakdown(c)["position_embedding"] == c.max_len  # one table, shared


def test_a_new_score_bias_is_one_registry_entry(monkeypatch):
  monkeypatch.setitem(POSITION_SCHEMES, "learned_slopes", LearnedSlopes())
  check_position_scheme("learned_slopes")
  check_score_bias("learned_slopes")
  check_listed("positions", "learned_slopes")
  c = tiny("encoder_decoder", "pre", positions="learned_slopes")
  assert counting.analytic_breakdown(c)["position_bias"] == 2 * c.num_heads  # one per stack
  with pytest.raises(ValueError, match="model.attention_impl='splash'.*use flash"):
    c.replace(attention_impl="splash", attention_block_q=128, attention_block_kv=128)


# ----------------------------------------------------------------------------- norm kinds
def check_norm_kind(name: str):
  """An encoder with norms at every site one can have: around each sublayer, on the queries
  and keys, after the embeddings and in the masked-LM head."""
  check_model(tiny("encoder", "pre", norm=name, qk_norm=True, embed_norm=True))


@pytest.mark.parametrize("name", list(NORM_KINDS))
def test_every_norm_kind_counts_trains_and_scans(name):
  check_norm_kind(name)


class MeanAbsNorm(NormKind):
  """t * x / mean|x|, t a learned scalar: a norm kind written in a test."""

  summary = "t * x / mean|x|, t a learned scalar (written in a test)"
  bias_by_default = True

  def normalise(self, norm, c, x):
    t = norm.param("temperature", nn.initializers.ones, (), jnp.float32)
    return t * x / (jnp.mean(jnp.abs(x), -1, keepdims=True) + c.norm_eps)


def test_a_new_norm_kind_is_one_registry_entry(monkeypatch):
  monkeypatch.setitem(NORM_KINDS, "meanabs", MeanAbsNorm())
  check_norm_kind("meanabs")
  check_listed("norm", "meanabs")
  c = tiny("decoder", "pre", norm="meanabs")
  params = nn.unbox(initializer(c)(KEY))
  assert set(params["final_norm"]) == {"temperature", "scale", "bias"}


# ----------------------------------------------------------------------------- activations
def check_activation(name: str):
  check_model(tiny("decoder", "pre", activation=name))


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_every_activation_counts_trains_and_scans(name):
  check_activation(name)


def test_a_new_activation_is_one_registry_entry(monkeypatch):
  reglu = Activation(jax.nn.relu, "ReLU(x W0) * x W1, gated (Shazeer 2020; in a test)", True)
  monkeypatch.setitem(ACTIVATIONS, "reglu", reglu)
  check_activation("reglu")
  check_listed("activation", "reglu")
  params = nn.unbox(initializer(tiny("decoder", "pre", activation="reglu"))(KEY))
  assert set(params["decoder"]["layer_0"]["ffn"]) == {"wi_0", "wi_1", "wo"}


@pytest.mark.parametrize("name", list(FEED_FORWARDS))
def test_every_feed_forward_kind_counts_trains_and_scans(name):
  check_model(tiny("decoder", "pre", feed_forward=name, num_experts=2))


class LinearSublayer(nn.Module):
  """x W with one D x D matrix: a feed-forward sublayer written in a test."""

  cfg: object
  init_rules: tuple = ()
  features: tuple = ()

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.cfg.d_model, use_bias=False, name="w")(x)


class LinearKind(FeedForwardKind):
  summary = "x W, one D x D matrix (written in a test)"

  def params(self, c, layer, active=False):
    return c.d_model * c.d_model

  def module(self, c, moe, deterministic, **kwargs):
    return LinearSublayer(c, **kwargs)


def test_a_new_feed_forward_kind_is_one_registry_entry(monkeypatch):
  monkeypatch.setitem(FEED_FORWARDS, "linear", LinearKind())
  check_model(tiny("decoder", "pre", feed_forward="linear"))
  check_listed("feed_forward", "linear")
  params = nn.unbox(initializer(tiny("decoder", "pre", feed_forward="linear"))(KEY))
  assert set(params["decoder"]["layer_0"]["ffn"]) == {"w"}


# ----------------------------------------------------------------------------- objectives
def check_objective(name: str):
  """A tiny model of the objective's first family (and head, and the fields it needs): the
  synthetic batch has the declared shapes, the training and held-out sums of its loss on it are
  finite (one program), and its own config fields are listed by --config_help with their
  meanings."""
  task = TASKS[name]
  family = task.families[0] if task.families else "decoder"
  head = {"head": task.heads[0]} if task.heads else {}
  model_cfg = tiny(family, "pre", num_classes=3, **head, **task.model_needs)
  config = experiment_config(training={"task": name, "batch_size": 2, "seq_len": 8})
  declared = task.batch_shapes(model_cfg, config)
  batch = task.synthetic_batch(model_cfg, config)
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
      k: (tuple(shape), np.dtype(dtype)) for k, (shape, dtype) in declared.items()
  }
  frozen = task.synthetic_frozen(model_cfg, config)
  model, options = build_model(model_cfg), task.loss_options(config)

  @jax.jit
  def run(params, batch, frozen):
    variables = {"params": params, **({"frozen": frozen} if frozen else {})}
    outputs, _ = task.outputs(model, variables, batch, {}, ["intermediates"])
    trained = task.loss(outputs, batch, model_cfg, options)
    return trained, task.loss(outputs, batch, model_cfg, None, train=False)

  params = nn.unbox(initializer(model_cfg)(KEY))
  sums, totals = jax.device_get(run(params, batch, frozen))
  metrics = task.metrics(sums, max(float(sums["weight"]), 1.0))
  held_out = task.eval_summary(TaskData(lambda step: batch, [batch]), totals)
  for key, value in {**metrics, **held_out}.items():
    assert np.all(np.isfinite(value)), (name, key, value)
  text = config_reference.help_text(experiment_config()).splitlines()
  assert f"    {name}: {summary_of(task)}" in text
  meanings = config_reference.meanings()
  for field in task.config_defaults() or {}:
    assert any(line.startswith(f"  {name}.{field} = ") for line in text), field
    assert meanings.get(f"{name}.{field}"), f"{name}.{field} has no comment beside it"


@pytest.mark.parametrize("name", list(TASKS))
def test_every_objective_builds_its_batch_and_loss_and_lists_its_fields(name):
  check_objective(name)


class EchoTokens(Task):
  """Each position predicts its own token, the loss scaled by `echo.scale`: an objective written
  in a test."""

  name = "echo"
  summary = "each position predicts its own token (written in a test)"
  families = ("decoder",)

  def config_defaults(self):
    c = ml_collections.ConfigDict()
    c.scale = 1.0  # echo: the training loss's scale
    return c

  def batch_shapes(self, model_cfg, config):
    return {"tokens": ((config.batch_size, config.seq_len), np.int32)}

  def outputs(self, model, variables, batch, rngs, mutable):
    out, state = model.apply(variables, batch["tokens"], rngs=rngs, mutable=mutable)
    return (out["logits"], batch["tokens"], jnp.ones(batch["tokens"].shape)), state

  def loss_options(self, config):
    return {**super().loss_options(config), "scale": config.echo.scale}

  def loss(self, outputs, batch, model_cfg, options, z_loss=0.0, train=True):
    sums = super().loss(outputs, batch, model_cfg, options, z_loss, train)
    if train:
      sums["loss"] = sums["loss"] * options["scale"]
    return sums


def test_a_new_objective_is_one_registry_entry(monkeypatch):
  monkeypatch.setitem(TASKS, "echo", EchoTokens())
  check_objective("echo")
  assert experiment_config().echo.scale == 1.0
