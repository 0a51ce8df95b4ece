"""The train state, created already sharded: parameters, optimizer state, step and base key."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.machine import parallel
from transformers_jax.models import initializer, lora


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # updates done
  params: Any
  opt_state: Any
  rng: jax.Array  # base key; step s uses fold_in(rng, s)


def params_like(opt_abstract, params_abstract, param_shardings, fallback):
  """Shardings for an optimizer state: subtrees shaped like the parameters follow them."""
  params_def = jax.tree_util.tree_structure(params_abstract)
  is_params = lambda x: jax.tree_util.tree_structure(x) == params_def  # noqa: E731
  leaves, treedef = jax.tree_util.tree_flatten(opt_abstract, is_leaf=is_params)
  return jax.tree_util.tree_unflatten(
      treedef, [param_shardings if is_params(x) else fallback for x in leaves]
  )


def state_shardings(model_cfg, tx, mesh, rule_table, seed: int = 0):
  """(abstract state, its shardings), from shapes alone. Raises a ValueError, before anything
  compiles, when a sharded dimension does not divide over its mesh axes."""
  boxed_params = initializer(model_cfg)
  key = jax.random.PRNGKey(seed)
  with nn.logical_axis_rules(rule_table):
    abstract_boxed = jax.eval_shape(boxed_params, key)
  parallel.check_divisible(abstract_boxed, mesh, rule_table)
  param_shardings = parallel.logical_shardings(abstract_boxed, mesh, rule_table)
  abstract_params = nn.unbox(abstract_boxed)
  opt_abstract = jax.eval_shape(tx.init, abstract_params)
  repl = parallel.replicated(mesh)
  trained, trained_shardings = (
      lora.trainable(tree, model_cfg) for tree in (abstract_params, param_shardings)
  )  # the optimizer's state mirrors the trained parameters (LoRA: the adapters only)
  shardings = TrainState(
      step=repl,
      params=param_shardings,
      opt_state=params_like(opt_abstract, trained, trained_shardings, repl),
      rng=repl,
  )
  abstract = TrainState(
      step=jax.ShapeDtypeStruct((), jnp.int32),
      params=abstract_params,
      opt_state=opt_abstract,
      rng=jax.eval_shape(lambda: key),
  )
  return abstract, shardings


def create_state(model_cfg, tx, mesh, rule_table, seed: int, shardings=None):
  """(state, shardings): the state is initialised inside jit with its output shardings, so no
  parameter ever exists unsharded on one device. `shardings`: state_shardings' own, where the
  caller holds them already (they are not derived a second time)."""
  if shardings is None:
    _, shardings = state_shardings(model_cfg, tx, mesh, rule_table, seed)
  boxed_params = initializer(model_cfg)

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


# The parts of the train state that config.host_offload can keep in the host's pinned memory.
HOST_OFFLOAD = ("optimizer", "params")


def host_offload_parts(config) -> tuple[str, ...]:
  """The parts config.host_offload names ("optimizer,params" -> ("optimizer", "params"))."""
  return tuple(p.strip() for p in str(config.get("host_offload", "")).split(",") if p.strip())


def offloaded(shardings: TrainState, parts) -> TrainState:
  """The state's shardings with the named `parts` (HOST_OFFLOAD) in the host's pinned memory: a
  step takes and returns them there, and moves them onto the devices where it uses them
  (`on_device`), so between steps they take no device memory."""
  host = lambda tree: jax.tree_util.tree_map(lambda s: s.with_memory_kind("pinned_host"), tree)  # noqa: E731
  return shardings.replace(
      params=host(shardings.params) if "params" in parts else shardings.params,
      opt_state=host(shardings.opt_state) if "optimizer" in parts else shardings.opt_state,
  )


def on_device(tree, shardings):
  """`tree` with each leaf whose sharding is in host memory moved to device memory, sharded
  alike (inside jit: a transfer XLA schedules; outside: a copy)."""

  def move(x, s):
    if s.memory_kind != "pinned_host":
      return x
    return jax.device_put(x, s.with_memory_kind("device"))

  return jax.tree_util.tree_map(move, tree, shardings)
