"""The pure update and eval bodies both drivers share, and the solo run's jit-compiled steps."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from transformers_jax.machine import parallel
from transformers_jax.models import build_model, lora, parameter_constraint
from transformers_jax.modules import moe_routing
from transformers_jax.train import optim
from transformers_jax.train.state import on_device


def sown_mean(tree, name: str, shape: tuple[int, ...] = ()):
  """The mean over layers of the values of `shape` sown as `name` (a scanned stack sows them
  with a leading layer axis)."""
  values = [
      jnp.reshape(leaf, (-1, *shape))
      for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
      if name in jax.tree_util.keystr(path)
  ]
  return jnp.mean(jnp.concatenate(values), axis=0)


def make_loss_fn(
    task,
    model_cfg,
    options,
    moe_aux_weight: float,
    z_loss=0.0,
    moe_router_z_weight: float = 0.0,
):
  """loss(params, batch, rng[, z_loss[, frozen]]) -> (objective, sums) for a Task
  (transformers_jax.tasks): the Task's forward pass and loss sums (`options`: its
  task.loss_options(config)). `z_loss` may be a float or, given as an argument, a traced
  scalar; `frozen` is what the Task reads but never trains (Task.frozen_runs). A MoE model adds its
  load-balancing loss and router z-loss (summed over layers) times their weights, and reports
  the per-expert share of routing choices and the dropped fraction."""
  train_model = build_model(model_cfg, deterministic=False)
  moe = model_cfg.feed_forward == "moe"

  def loss_fn(params, batch, rng, z_weight=z_loss, frozen=None):
    variables = {"params": params} if frozen is None else {"params": params, "frozen": frozen}
    outputs, state = task.outputs(
        train_model,
        variables,
        batch,
        {"dropout": rng},
        ["losses", "moe_stats"] if moe else ["losses"],
    )
    sums = task.loss(outputs, batch, model_cfg, options, z_weight)
    objective = sums["loss"]
    if moe:
      stats = state["moe_stats"]
      for key, tree, name, weight in (
          ("aux", state["losses"], "moe_aux_loss", moe_aux_weight),
          ("router_z", stats, "router_z_loss", moe_router_z_weight),
      ):
        total = sum(
            jnp.sum(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
            if name in jax.tree_util.keystr(path)
        )
        sums[key] = total * sums["weight"]
        objective = objective + weight * sums[key]
      sums["moe_dropped"] = sown_mean(stats, "dropped_fraction") * sums["weight"]
      sums["moe_expert_fraction"] = (
          sown_mean(stats, "expert_fraction", (model_cfg.num_experts,)) * sums["weight"]
      )
      if lora.has_state(model_cfg):  # each layer's loads, for its routing bias
        sums["router_loads"] = moe_routing.layer_loads(stats)
    return objective, sums

  return loss_fn


def make_update(task, model_cfg, config, optimizer, grad_shardings=None):
  """The pure update body both drivers share: update(params, opt_state, batch, rng, hparams
  [, frozen]) -> (params, opt_state, metrics). A solo run jits it (make_train_step); a
  population vmaps it over its members (train/members.py). `optimizer(hparams)` is the optax
  transformation for those hyperparameters (optim.HPARAMS: Python numbers, or a member's traced
  scalars); `grad_shardings` pins the accumulated gradients of micro-batches to the parameters'
  layout; `frozen` is the Task's (Task.frozen_runs), shared by every micro-batch and member.

  After optax's update the model's parameter constraint, where the config declares one
  (models.parameter_constraint: a placement's `constraint`, e.g. nGPT's unit-norm weights),
  maps the new parameters back onto its manifold: every driver, and each member of a
  population, runs this one body, so all of them apply it after every step."""
  loss_fn = make_loss_fn(
      task,
      model_cfg,
      task.loss_options(config),
      config.moe_aux_weight,
      moe_router_z_weight=config.moe_router_z_weight,
  )
  accum = config.grad_accum_steps
  constrain = parameter_constraint(model_cfg)  # params -> params after each step, or None
  # What is differentiated and updated: every parameter, or with LoRA the adapters only (the
  # rest enters the loss as a constant and gets neither gradients nor optimizer state).
  trained_of = lambda p: lora.trainable(p, model_cfg)  # noqa: E731
  if grad_shardings is not None:
    grad_shardings = trained_of(grad_shardings)

  def loss_of_trained(trained, params, *args):
    return loss_fn(lora.with_trainable(params, trained, model_cfg), *args)

  value_and_grad = jax.value_and_grad(loss_of_trained, has_aux=True)

  def update(params, opt_state, batch, rng, hparams, frozen=None):
    z_loss = hparams["z_loss"]
    trained = trained_of(params)
    grad_fn = lambda *args: value_and_grad(trained, params, *args)  # noqa: E731
    if accum == 1:
      (_, sums), grads = grad_fn(batch, rng, z_loss, frozen)
    else:
      micro = jax.tree_util.tree_map(
          lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch
      )

      def body(carry, xs):
        i, mb = xs
        (_, s), g = grad_fn(mb, jax.random.fold_in(rng, i), z_loss, frozen)
        if grad_shardings is not None:
          g = jax.lax.with_sharding_constraint(g, grad_shardings)
        return jax.tree_util.tree_map(jnp.add, carry, (g, s)), None

      first = jax.tree_util.tree_map(lambda x: x[0], micro)
      # z_loss stays as given (a Python 0.0 drops "z_loss" from the sums; eval_shape would make
      # it abstract and keep it), so the zeros have the sums' own keys
      shapes = jax.eval_shape(lambda b, r: grad_fn(b, r, z_loss, frozen), first, rng)
      zero_sums = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0][1])
      zeros = (jax.tree_util.tree_map(jnp.zeros_like, trained), zero_sums)
      (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), micro))
    weight = jnp.maximum(sums["weight"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / weight, grads)
    updates, opt_state = optimizer(hparams).update(grads, opt_state, trained)
    params = lora.with_trainable(params, optax.apply_updates(trained, updates), model_cfg)
    if "router_loads" in sums:  # DeepSeek-V3's bias, moved against the step's loads
      params = moe_routing.updated_bias(model_cfg, params, sums.pop("router_loads"))
    if constrain is not None:
      params = constrain(params)
    metrics = task.metrics(sums, weight)
    metrics["grad_norm"] = optax.tree_utils.tree_norm(grads)
    if "aux" in sums:
      metrics["moe_aux_loss"] = sums["aux"] / weight
      metrics["moe_router_z_loss"] = sums["router_z"] / weight
      metrics["moe_dropped_fraction"] = sums["moe_dropped"] / weight
      fractions = sums["moe_expert_fraction"] / weight
      for e in range(model_cfg.num_experts):  # share of routing choices per expert
        metrics[f"moe_expert_fraction_{e}"] = fractions[e]
    return params, opt_state, metrics

  return update


class WithFrozen:
  """A jitted step(state, batch, frozen) called as step(state, batch): the Task's frozen arrays
  (Task.frozen_runs) are passed on every call, arguments like the state (sharded, never constants
  baked into the program). `lower` lowers it the same way."""

  def __init__(self, jitted, frozen):
    self.jitted, self.frozen = jitted, frozen

  def __call__(self, *args):
    return self.jitted(*args, self.frozen)

  def lower(self, *args):
    return self.jitted.lower(*args, self.frozen)


def frozen_shardings(frozen):
  """The shardings of the Task's frozen arrays, as placed (Task.frozen_runs)."""
  return jax.tree_util.tree_map(lambda a: a.sharding, frozen)


def in_mesh(fn, mesh, rule_table):
  """`fn` traced with the mesh and the logical-axis rules in context: the model's logical
  activation constraints bind to them (flax drops them silently without a mesh)."""

  def wrapped(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rule_table):
      return fn(*args)

  return wrapped


def make_train_step(
    task, model_cfg, config, tx, schedule, mesh, rule_table, shardings, frozen=None
):
  """jit(step)(state, batch) -> (state, metrics): the update body with the config's own
  hyperparameters; the state is donated. With the Task's `frozen` arrays (Task.frozen_runs) the
  jitted step takes them as a third argument, passed on each call (WithFrozen)."""
  update = make_update(task, model_cfg, config, lambda _: tx, shardings.params)
  hparams = optim.config_hparams(config)

  def step(state, batch, *frozen_arg):
    rng = jax.random.fold_in(state.rng, state.step)
    params, opt_state, metrics = update(
        on_device(state.params, shardings.params),  # config.host_offload: from the host
        on_device(state.opt_state, shardings.opt_state),
        batch,
        rng,
        hparams,
        *frozen_arg,
    )
    metrics["lr"] = schedule(state.step)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  in_shardings = (shardings, parallel.batch_sharding(mesh))
  if frozen is not None:
    in_shardings += (frozen_shardings(frozen),)
  jitted = jax.jit(
      in_mesh(step, mesh, rule_table),
      in_shardings=in_shardings,
      out_shardings=(shardings, parallel.replicated(mesh)),
      donate_argnums=0,
  )
  return jitted if frozen is None else WithFrozen(jitted, frozen)


def make_evaluate(task, model_cfg):
  """The pure eval body both drivers share: evaluate(params, batch[, frozen]) ->
  (sums, intermediates): the Task's held-out sums (Task.loss with train=False) and what the
  model sowed (residual RMS, attention logits, MoE drops)."""
  model = build_model(model_cfg)

  def evaluate(params, batch, frozen=None):
    variables = {"params": params} if frozen is None else {"params": params, "frozen": frozen}
    outputs, state = task.outputs(model, variables, batch, {}, ["intermediates"])
    return task.loss(outputs, batch, model_cfg, None, train=False), state["intermediates"]

  return evaluate


def make_eval_step(task, model_cfg, mesh, rule_table, shardings, frozen=None):
  """jit(evaluate)(params, batch) -> (sums, intermediates) of one model."""
  in_shardings = (shardings.params, parallel.batch_sharding(mesh))
  if frozen is not None:
    in_shardings += (frozen_shardings(frozen),)
  evaluate = make_evaluate(task, model_cfg)
  jitted = jax.jit(
      in_mesh(lambda p, *rest: evaluate(on_device(p, shardings.params), *rest), mesh, rule_table),
      in_shardings=in_shardings,
      out_shardings=parallel.replicated(mesh),
  )
  return jitted if frozen is None else WithFrozen(jitted, frozen)


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
    layer = next((k for k in keys if re.fullmatch(r"layer_\d+|layers(_from_\d+)?", k)), None)
    if layer is None:  # a block outside the stacks (multi-token prediction's)
      continue
    values = jnp.ravel(jnp.asarray(leaf))
    if layer.startswith("layers"):  # scanned: one array with a value per layer of the run
      start = int(layer.rpartition("_")[2]) if layer != "layers" else 0
      found.setdefault(stack, []).extend(enumerate(values.tolist(), start))
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
