"""The train state, created already sharded, and the jit-compiled train and eval steps."""

from __future__ import annotations

import re
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from transformers_jax import parallel
from transformers_jax.models import build_model, example_inputs
from transformers_jax.tasks import cross_entropy


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # updates done
  params: Any
  opt_state: Any
  rng: jax.Array  # base key; step s uses fold_in(rng, s)


def _params_like(opt_abstract, params_abstract, param_shardings, fallback):
  """Shardings for an optimizer state: subtrees shaped like the parameters follow them."""
  params_def = jax.tree_util.tree_structure(params_abstract)
  is_params = lambda x: jax.tree_util.tree_structure(x) == params_def  # noqa: E731
  leaves, treedef = jax.tree_util.tree_flatten(opt_abstract, is_leaf=is_params)
  return jax.tree_util.tree_unflatten(
      treedef, [param_shardings if is_params(x) else fallback for x in leaves]
  )


def boxed_init(model_cfg):
  """rng -> the model's parameters, boxed with their logical axis names."""
  model = build_model(model_cfg)
  inputs = example_inputs(model_cfg)
  return lambda rng: model.init({"params": rng}, *inputs)["params"]


def state_shardings(model_cfg, tx, mesh, rule_table, seed: int = 0):
  """(abstract state, its shardings), from shapes alone. Raises a ValueError, before anything
  compiles, when a sharded dimension does not divide over its mesh axes."""
  boxed_params = boxed_init(model_cfg)
  key = jax.random.PRNGKey(seed)
  with nn.logical_axis_rules(rule_table):
    abstract_boxed = jax.eval_shape(boxed_params, key)
  parallel.check_divisible(abstract_boxed, mesh, rule_table)
  param_shardings = parallel.logical_shardings(abstract_boxed, mesh, rule_table)
  abstract_params = nn.unbox(abstract_boxed)
  opt_abstract = jax.eval_shape(tx.init, abstract_params)
  repl = parallel.replicated(mesh)
  shardings = TrainState(
      step=repl,
      params=param_shardings,
      opt_state=_params_like(opt_abstract, abstract_params, param_shardings, repl),
      rng=repl,
  )
  abstract = TrainState(
      step=jax.ShapeDtypeStruct((), jnp.int32),
      params=abstract_params,
      opt_state=opt_abstract,
      rng=jax.eval_shape(lambda: key),
  )
  return abstract, shardings


def create_state(model_cfg, tx, mesh, rule_table, seed: int):
  """(state, shardings): the state is initialised inside jit with its output shardings, so no
  parameter ever exists unsharded on one device."""
  _, shardings = state_shardings(model_cfg, tx, mesh, rule_table, seed)
  boxed_params = boxed_init(model_cfg)

  def init(rng):
    with nn.logical_axis_rules(rule_table):
      params = nn.unbox(boxed_params(jax.random.fold_in(rng, 0)))
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.fold_in(rng, 1),
    )

  state = jax.jit(init, out_shardings=shardings)(jax.random.PRNGKey(seed))
  return state, shardings


def abstract_state(state, shardings):
  """ShapeDtypeStructs with shardings: the restore target for a checkpoint."""
  return jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
  )


def make_loss_fn(task, model_cfg, label_smoothing: float, moe_aux_weight: float, z_loss=0.0):
  """loss(params, batch, rng) -> (objective, sums) for a Task (transformers_jax.tasks).
  `z_loss` may be a float or, given as loss(params, batch, rng, z_loss), a traced scalar."""
  train_model = build_model(model_cfg, deterministic=False)
  moe = model_cfg.feed_forward == "moe"

  def loss_fn(params, batch, rng, z_weight=z_loss):
    (logits, targets, weights), state = task.outputs(
        train_model, {"params": params}, batch, {"dropout": rng}, ["losses"]
    )
    padded = logits.shape[-1] == model_cfg.padded_vocab != model_cfg.vocab_size
    sums = cross_entropy(
        logits,
        targets,
        weights,
        label_smoothing,
        model_cfg.vocab_size if padded else None,
        z_weight,
    )
    objective = sums["loss"]
    if moe:
      aux = sum(jnp.sum(a) for a in jax.tree_util.tree_leaves(state["losses"]))
      sums["aux"] = aux * sums["weight"]
      objective = objective + moe_aux_weight * sums["aux"]
    return objective, sums

  return loss_fn


def make_train_step(task, model_cfg, config, tx, schedule, mesh, rule_table, shardings):
  """jit(step)(state, batch) -> (state, metrics); the state is donated."""
  loss_fn = make_loss_fn(
      task, model_cfg, config.label_smoothing, config.moe_aux_weight, config.get("z_loss", 0.0)
  )
  accum = config.grad_accum_steps
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    if accum == 1:
      (_, sums), grads = grad_fn(state.params, batch, rng)
    else:
      micro = jax.tree_util.tree_map(
          lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch
      )

      def body(carry, xs):
        i, mb = xs
        (_, s), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        g = jax.lax.with_sharding_constraint(g, shardings.params)
        return jax.tree_util.tree_map(jnp.add, carry, (g, s)), None

      zero_sums = jax.tree_util.tree_map(
          lambda s: jnp.zeros(s.shape, s.dtype),
          jax.eval_shape(grad_fn, state.params, jax.tree_util.tree_map(lambda x: x[0], micro), rng)[
              0
          ][1],
      )
      zeros = (jax.tree_util.tree_map(jnp.zeros_like, state.params), zero_sums)
      (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), micro))
    weight = jnp.maximum(sums["weight"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / weight, grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": sums["loss"] / weight,
        "nll": sums["nll"] / weight,
        "accuracy": sums["correct"] / weight,
        "grad_norm": optax.tree_utils.tree_norm(grads),
        "lr": schedule(state.step),
    }
    if config.get("z_loss", 0.0):
      metrics["log_z_squared"] = sums["z_loss"] / weight
    if "aux" in sums:
      metrics["moe_aux_loss"] = sums["aux"] / weight
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new, metrics

  def run(state, batch):
    # The mesh in context makes the model's logical activation constraints bind (flax drops
    # them silently without one), so activations stay split over the batch axes.
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rule_table):
      return step(state, batch)

  return jax.jit(
      run,
      in_shardings=(shardings, parallel.batch_sharding(mesh)),
      out_shardings=(shardings, parallel.replicated(mesh)),
      donate_argnums=0,
  )


def make_eval_step(task, model_cfg, mesh, rule_table, shardings):
  """jit(eval)(params, batch) -> (sums, residual RMS per layer per stack)."""
  model = build_model(model_cfg)

  def evaluate(params, batch):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rule_table):
      (logits, targets, weights), state = task.outputs(
          model, {"params": params}, batch, {}, ["intermediates"]
      )
    return cross_entropy(logits, targets, weights), state["intermediates"]

  return jax.jit(
      evaluate,
      in_shardings=(shardings.params, parallel.batch_sharding(mesh)),
      out_shardings=parallel.replicated(mesh),
  )


def residual_rms(intermediates) -> dict[str, list[float]]:
  """{stack: [RMS of the residual stream after each block]} from the sown intermediates."""
  return per_layer(intermediates, "residual_rms")


def attention_logit_max(intermediates) -> dict[str, list[float]]:
  """{stack: [largest attention logit in each block]} (self- and cross-attention together)
  from the sown intermediates; empty when none were sown."""
  return per_layer(intermediates, "attention_logit_max")


def per_layer(intermediates, name: str) -> dict[str, list[float]]:
  """{stack: [value of the sown scalar `name` in each block]}; a block that sows it more than
  once (self- and cross-attention) reports the largest."""
  found: dict[str, list[tuple[int, Any]]] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(intermediates)[0]:
    keys = jax.tree_util.keystr(path, simple=True, separator="/").split("/")
    if name not in keys:
      continue
    stack = keys[0]
    layer = next((k for k in keys if re.fullmatch(r"layer_\d+|layers", k)), None)
    values = jnp.ravel(jnp.asarray(leaf))
    if layer == "layers":  # scanned: one array with a value per layer
      found.setdefault(stack, []).extend(enumerate(values.tolist()))
    else:
      found.setdefault(stack, []).append((int(layer.split("_")[1]), float(values[0])))
  out = {}
  for stack, items in found.items():
    layers: dict[int, float] = {}
    for i, v in items:
      layers[i] = max(layers.get(i, v), v)
    out[stack] = [layers[i] for i in sorted(layers)]
  return out


def moe_dropped_fraction(intermediates) -> float | None:
  """Mean over MoE layers of the fraction of routing choices dropped for lack of expert
  capacity, from the sown intermediates; None for a model without MoE layers."""
  values = [
      jnp.ravel(jnp.asarray(leaf))
      for path, leaf in jax.tree_util.tree_flatten_with_path(intermediates)[0]
      if "moe_dropped_fraction" in jax.tree_util.keystr(path)
  ]
  return float(jnp.mean(jnp.concatenate(values))) if values else None
