"""A population's members: who they are, their stacked state and the vmapped step.

Every combination of `population.seeds` seeds and the listed learning rates, weight decays,
warmups and z-loss weights is a member: a full model with its own parameters, optimizer state,
dropout key, data order (its seed's) and hyperparameters. The step is the solo run's update
body (train/step.py make_update) vmapped over the members, with an alive mask: a member whose
loss or gradient becomes non-finite keeps its state from before that update, and the others
carry on.

Where the members go is the mesh's to say: with a data axis that divides the member count, the
members are split over it (each device holding whole members) and each member's batch and
parameters over the remaining axes as a solo model's are; otherwise every member is laid out
exactly like a solo model (batch over data x fsdp, parameters over fsdp and tensor).
"""

from __future__ import annotations

import ast
import itertools
import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P

from transformers_jax.machine import parallel
from transformers_jax.models import initializer
from transformers_jax.errors import UserError
from transformers_jax.records import asks_for_population
from transformers_jax.train import optim, resume
from transformers_jax.train.step import (
    WithFrozen,
    frozen_shardings,
    in_mesh,
    make_evaluate,
    make_update,
)

# population list field -> the training field it varies (one value per member)
LISTS = {
    "learning_rates": "learning_rate",
    "weight_decay": "weight_decay",
    "warmup_steps": "warmup_steps",
    "z_loss": "z_loss",
}
HPARAMS = optim.HPARAMS


def enabled(config) -> bool:
  """Whether `config` asks for a population (any list set, or seeds > 0)."""
  return asks_for_population(config.get("population"))


def list_values(config, name: str) -> tuple[float, ...]:
  """The values of population list `name`: the parsed tuple, or the top-level field alone."""
  field = LISTS[name]
  text = str(config.population.get(name, "")).strip()
  if not text:
    return (float(config[field]),)
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = None
  if isinstance(value, (int, float)):
    value = (value,)
  if not (
      isinstance(value, (tuple, list))
      and value
      and all(isinstance(v, (int, float)) and math.isfinite(v) for v in value)
  ):
    raise UserError(
        f"population.{name}={text!r}: give a tuple of numbers, e.g. "
        f'--config.population.{name}="(1e-3, 3e-3)"'
    )
  if field == "learning_rate" and min(value) <= 0:
    raise UserError(f"population.{name}={text!r}: learning rates must be positive")
  if min(value) < 0:
    raise UserError(f"population.{name}={text!r}: values must be >= 0")
  if field == "warmup_steps" and any(float(v) != int(v) for v in value):
    raise UserError(f"population.{name}={text!r}: warmup steps are whole numbers")
  return tuple(float(v) for v in value)


def members(config) -> list[dict]:
  """One dict per member, in order: {"member", "seed", "learning_rate", "weight_decay",
  "warmup_steps", "z_loss"}; seeds vary slowest."""
  seeds = range(config.seed, config.seed + max(config.population.seeds, 1))
  grids = [list_values(config, name) for name in LISTS]
  out = []
  for i, (seed, *values) in enumerate(itertools.product(seeds, *grids)):
    m = {"member": i, "seed": seed, **dict(zip(LISTS.values(), values))}
    m["warmup_steps"] = int(m["warmup_steps"])
    out.append(m)
  return out


def describe(member: dict) -> str:
  return ", ".join(f"{k} {member[k]:g}" for k in ("seed", *HPARAMS))


def chosen(workdir, member: int) -> str:
  """Which member `--member` / `init_member` took from the population's run in `workdir`, for
  the user to see: "member 2 of 4 (seed 0, learning_rate 0.003, ...)"."""
  from transformers_jax.run_folder.runs import Run

  table = members(Run(workdir).config())
  return f"member {member} of {len(table)} ({describe(table[member])})"


@flax.struct.dataclass
class PopulationState:
  step: jax.Array  # updates done (shared)
  params: Any  # every leaf has a leading member axis
  opt_state: Any
  rng: jax.Array  # [M] base keys; step s uses fold_in(rng, s), as a solo run does
  alive: jax.Array  # [M] bool: False once the member diverged (its state is then frozen)
  diverged_at: jax.Array  # [M] int32: the step whose update was non-finite; 0 = never
  hparams: dict  # {name: [M]} the members' seeds and hyperparameters


def hparam_arrays(table: list[dict]) -> dict:
  out = {name: np.array([m[name] for m in table], np.float32) for name in HPARAMS}
  out["seed"] = np.array([m["seed"] for m in table], np.int32)
  return out


def member_axis(mesh, count: int) -> str | None:
  """ "data" when the mesh's data axis splits the members evenly, else None (every member laid
  out like a solo model)."""
  n = mesh.shape["data"]
  return "data" if n > 1 and count % n == 0 else None


def without_axis(rule_table, axis: str | None):
  """The logical-axis rules with mesh axis `axis` taken out (it holds the members)."""
  if axis is None:
    return rule_table
  out = []
  for name, axes in rule_table:
    kept = tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ()) if a != axis)
    out.append((name, None if not kept else kept[0] if len(kept) == 1 else kept))
  return tuple(out)


def stacked(sharding, axis: str | None):
  """A solo sharding with a leading member dimension over `axis` (None: replicated)."""
  return NamedSharding(sharding.mesh, P(axis, *sharding.spec))


def population_shardings(solo_abstract, solo_shardings, table, axis):
  """(abstract PopulationState, its shardings) from the solo state's, for the members of
  `table`."""
  count = len(table)
  member = lambda x: jax.ShapeDtypeStruct((count, *x.shape), x.dtype)  # noqa: E731
  hp = hparam_arrays(table)
  abstract = PopulationState(
      step=solo_abstract.step,
      params=jax.tree_util.tree_map(member, solo_abstract.params),
      opt_state=jax.tree_util.tree_map(member, solo_abstract.opt_state),
      rng=member(solo_abstract.rng),
      alive=jax.ShapeDtypeStruct((count,), jnp.bool_),
      diverged_at=jax.ShapeDtypeStruct((count,), jnp.int32),
      hparams={k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in hp.items()},
  )
  mesh = solo_shardings.step.mesh
  by_member = NamedSharding(mesh, P(axis))
  shardings = PopulationState(
      step=solo_shardings.step,
      params=jax.tree_util.tree_map(lambda s: stacked(s, axis), solo_shardings.params),
      opt_state=jax.tree_util.tree_map(lambda s: stacked(s, axis), solo_shardings.opt_state),
      rng=by_member,
      alive=by_member,
      diverged_at=by_member,
      hparams={k: by_member for k in hp},
  )
  return abstract, shardings


def optimizer(config):
  """hparams -> the optax transformation of a member with those (traced) hyperparameters."""
  return lambda h: optim.make_optimizer(config, h)


def init_state(setup) -> PopulationState:
  """Every member initialised as its solo run would be from its seed, inside one jit. Members
  split over devices are made in parallel (vmap: each device makes its own); otherwise one after
  the other (lax.map, each written into its slice of the stacked state): the same values, but
  one member's init in a loop, which XLA compiles in about a solo run's init time where the
  vmapped program takes about 1.5x as long, and which holds one member's temporaries at a time."""
  init_params = initializer(setup.model_cfg)
  tx_for = optimizer(setup.config)
  count = len(setup.members)

  def init_member(h):
    key = jax.random.PRNGKey(h["seed"])
    with nn.logical_axis_rules(setup.rule_table):
      params = nn.unbox(init_params(jax.random.fold_in(key, 0)))
    return params, tx_for(h).init(params), jax.random.fold_in(key, 1)

  def init(h):
    if setup.member_axis is None:
      params, opt_state, rng = jax.lax.map(init_member, h)
    else:
      params, opt_state, rng = jax.vmap(init_member)(h)
    return PopulationState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=opt_state,
        rng=rng,
        alive=jnp.ones((count,), bool),
        diverged_at=jnp.zeros((count,), jnp.int32),
        hparams=h,
    )

  return jax.jit(init, out_shardings=setup.shardings)(hparam_arrays(setup.members))


def make_train_step(setup, solo_param_shardings):
  """jit(step)(state, batch [M, B, ...]) -> (state, metrics [M]): the update body vmapped over
  the members, a diverged member's state kept as it was; the state is donated."""
  config = setup.config
  update = make_update(setup.task, setup.model_cfg, config, optimizer(config), solo_param_shardings)

  def member_step(params, opt_state, rng, alive, diverged_at, h, step, batch, *frozen):
    new_params, new_opt, metrics = update(
        params, opt_state, batch, jax.random.fold_in(rng, step), h, *frozen
    )
    metrics["lr"] = optim.learning_rate(config, step, h["learning_rate"], h["warmup_steps"])
    ok = alive & jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
    diverged_at = jnp.where(alive & ~ok, step + 1, diverged_at)
    new_params = jax.tree_util.tree_map(keep, new_params, params)
    return new_params, jax.tree_util.tree_map(keep, new_opt, opt_state), ok, diverged_at, metrics

  def step(state, batch, *frozen):  # the Task's frozen arrays: every member's, not vmapped
    s = state
    params, opt_state, alive, diverged_at, metrics = jax.vmap(
        member_step,
        in_axes=(0, 0, 0, 0, 0, 0, None, 0) + (None,) * len(frozen),
        spmd_axis_name=setup.member_axis,
    )(s.params, s.opt_state, s.rng, s.alive, s.diverged_at, s.hparams, s.step, batch, *frozen)
    new = s.replace(
        step=s.step + 1, params=params, opt_state=opt_state, alive=alive, diverged_at=diverged_at
    )
    return new, metrics

  by_member = NamedSharding(setup.mesh, P(setup.member_axis))
  frozen = setup.frozen
  in_shardings = (setup.shardings, setup.batch_sharding())
  if frozen is not None:
    in_shardings += (frozen_shardings(frozen),)
  jitted = jax.jit(
      in_mesh(step, setup.mesh, setup.rule_table),
      in_shardings=in_shardings,
      out_shardings=(setup.shardings, by_member),
      donate_argnums=0,
  )
  return jitted if frozen is None else WithFrozen(jitted, frozen)


def make_eval_step(setup):
  """jit(evaluate)(params [M, ...], batch) -> (sums [M], intermediates [M, ...]): every member
  on the same held-out batch."""
  frozen = setup.frozen
  evaluate = jax.vmap(
      make_evaluate(setup.task, setup.model_cfg),
      in_axes=(0, None) + (() if frozen is None else (None,)),
      spmd_axis_name=setup.member_axis,
  )
  in_shardings = (setup.shardings.params, setup.eval_batch_sharding())
  if frozen is not None:
    in_shardings += (frozen_shardings(frozen),)
  jitted = jax.jit(
      in_mesh(evaluate, setup.mesh, setup.rule_table),
      in_shardings=in_shardings,
      out_shardings=NamedSharding(setup.mesh, P(setup.member_axis)),
  )
  return jitted if frozen is None else WithFrozen(jitted, frozen)


def non_finite_alive(state) -> str | None:
  """None when the parameters and optimizer state of every member still training are finite
  (a diverged member's frozen state may legitimately hold infinities), else which are not."""
  alive = state.alive

  def live_only(x):
    if not jnp.issubdtype(x.dtype, jnp.inexact) or x.ndim == 0 or x.shape[0] != alive.shape[0]:
      return x
    return jnp.where(alive.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))

  live = jax.jit(lambda t: jax.tree_util.tree_map(live_only, t))(
      {"params": state.params, "opt_state": state.opt_state}
  )
  return resume.non_finite(live)


def member(tree, i: int):
  """Member `i`'s slice of a stacked (host) tree."""
  return jax.tree_util.tree_map(lambda a: a[i], tree)


def put_stacked(rows_of, shape_dtypes: dict, sharding) -> dict:
  """Global [M, B, ...] arrays split as `sharding` says, each process building only the
  (member, rows) blocks its devices hold: `rows_of(member, start, stop)` -> a dict of numpy
  rows of that member's batch."""
  out = {}
  cache: dict = {}

  def block(key, index):
    ms, rows = index[0], index[1]
    count, size = shape_dtypes[key][0][:2]
    m0, m1, _ = ms.indices(count)
    r0, r1, _ = rows.indices(size)
    parts = []
    for m in range(m0, m1):
      if (m, r0, r1) not in cache:
        cache[(m, r0, r1)] = rows_of(m, r0, r1)
      parts.append(cache[(m, r0, r1)][key])
    return np.stack(parts)[(slice(None), slice(None), *index[2:])]

  for key, (shape, dtype) in shape_dtypes.items():
    out[key] = jax.make_array_from_callback(
        shape, sharding, lambda index, key=key, dtype=dtype: block(key, index).astype(dtype)
    )
  return out


def stacked_batch_sharding(mesh, axis: str | None) -> NamedSharding:
  """[M, B, ...]: members over `axis`, each member's rows over the remaining batch axes."""
  return NamedSharding(mesh, P(axis, tuple(a for a in parallel.BATCH_AXES if a != axis)))
