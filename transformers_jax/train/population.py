"""Population training: many small models trained as one program.

Every combination of `population.seeds` seeds and the listed learning rates, weight decays,
warmups and z-loss weights is a *member*: a full model with its own parameters, optimizer state,
dropout key, data order (its seed's) and hyperparameters. One jit-compiled step vmaps the solo
train step over the members, so a member's losses are those of the same run trained alone (up to
float rounding of the batched matmuls). The member axis is split over the mesh's data axis when
there are several devices.

A member whose loss or gradient becomes non-finite is marked diverged: from that step on its
parameters and optimizer state are frozen (its updates are zeroed) and the others carry on.
metrics.jsonl gets one line per member per logged step, with `member`, its hyperparameters and
`diverged`; TensorBoard gets the same values under `member_<i>/`. Checkpoints hold every member
(and the hyperparameters, checked on resume).
"""

from __future__ import annotations

import ast
import itertools
import math
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from transformers_jax import parallel
from transformers_jax.errors import UserError
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model
from transformers_jax.runs import Run
from transformers_jax.tasks import cross_entropy, task_data, task_for
from transformers_jax.train import metrics as metrics_lib
from transformers_jax.train import resume
from transformers_jax.train.events import step_events
from transformers_jax.train.optim import make_optimizer
from transformers_jax.train.preemption import StopRequests
from transformers_jax.train.step import boxed_init, make_loss_fn, per_layer
from transformers_jax.train_config import validate

# population list field -> the training field it varies (one value per member)
LISTS = {
    "learning_rates": "learning_rate",
    "weight_decay": "weight_decay",
    "warmup_steps": "warmup_steps",
    "z_loss": "z_loss",
}
HPARAMS = tuple(LISTS.values())


def enabled(config) -> bool:
  """Whether `config` asks for a population (any list set, or seeds > 0)."""
  pop = config.get("population")
  if pop is None:
    return False
  return pop.seeds > 0 or any(str(pop.get(name, "")).strip() for name in LISTS)


def _values(config, name: str) -> tuple[float, ...]:
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
  grids = [_values(config, name) for name in LISTS]
  out = []
  for i, (seed, *values) in enumerate(itertools.product(seeds, *grids)):
    m = {"member": i, "seed": seed, **dict(zip(HPARAMS, values))}
    m["warmup_steps"] = int(m["warmup_steps"])
    out.append(m)
  return out


def member_schedule(config, peak, warmup):
  """The config's learning-rate schedule with a member's peak and warmup (traced scalars): the
  same values as optim.schedule for the same numbers."""
  steps, kind, alpha = config.steps, config.lr_schedule, config.min_lr_ratio

  def fn(step):
    s = jnp.asarray(step, jnp.float32)
    w = jnp.asarray(warmup, jnp.float32)
    if kind == "rsqrt":
      w1 = jnp.maximum(w, 1.0)
      return peak * jnp.minimum(s / w1, jnp.sqrt(w1 / jnp.maximum(s, 1.0)))
    decay = jnp.maximum(steps - w, 1.0)
    t = jnp.clip(s - w, 0.0, decay)
    if kind == "cosine":
      after = peak * ((1 - alpha) * (0.5 * (1 + jnp.cos(jnp.pi * t / decay))) + alpha)
    elif kind == "linear":
      after = peak * (1 - t / decay)
    else:
      after = peak * jnp.ones_like(s)
    warm = -peak * (1 - s / jnp.maximum(w, 1.0)) + peak  # optax's linear_schedule(0, peak, w)
    return jnp.where(s < w, warm, after)

  return fn


@flax.struct.dataclass
class PopulationState:
  step: jax.Array  # updates done (shared)
  params: Any  # every leaf has a leading member axis
  opt_state: Any
  rng: jax.Array  # [M] base keys; step s uses fold_in(rng, s), as a solo run does
  alive: jax.Array  # [M] bool: False once the member diverged (its state is then frozen)
  diverged_at: jax.Array  # [M] int32: the step whose update was non-finite; 0 = never
  hparams: dict  # {name: [M]} the members' seeds and hyperparameters


def _hparam_arrays(table: list[dict]) -> dict:
  out = {name: np.array([m[name] for m in table], np.float32) for name in HPARAMS}
  out["seed"] = np.array([m["seed"] for m in table], np.int32)
  return out


def _member_sharding(mesh, count: int):
  """Members split over the data axis where they divide evenly, else replicated."""
  n = mesh.shape["data"]
  return NamedSharding(mesh, P("data") if n > 1 and count % n == 0 else P())


def train_population(config, workdir: str, task=None) -> dict:
  """Train (or resume) a population in `workdir`: train()'s run folder, checkpoints and
  metrics, one line per member. Returns {"members": [final metrics per member], "step",
  "member_devices": how many devices the members are split over}."""
  run = Run(workdir)
  workdir = run.path
  model_cfg = ModelConfig.from_dict(config.model)
  mesh = parallel.make_mesh(config.mesh.to_dict())
  validate(config, model_cfg, 1)
  if mesh.shape["fsdp"] * mesh.shape["tensor"] * mesh.shape["expert"] > 1:
    raise UserError(
        "a population splits its members over the data axis only: set "
        "--config.mesh.fsdp=1 --config.mesh.tensor=1 --config.mesh.expert=1"
    )
  if jax.process_count() > 1:
    raise UserError(
        "a population trains in one process: run it on one host (its members split over "
        "that host's devices)"
    )
  if config.grad_accum_steps != 1:
    raise UserError("grad_accum_steps: a population takes whole batches; set it to 1")
  if config.init_from:
    raise UserError("init_from: a population starts from fresh members; set it to ''")
  table = members(config)
  count = len(table)
  workdir.mkdir(parents=True, exist_ok=True)
  resume.check_same_model(run, config)
  task = task or task_for(model_cfg)
  seeds = sorted({m["seed"] for m in table})
  datas = {}
  for seed in seeds:  # each seed's batch stream, as its solo run sees it
    member_config = config.copy_and_resolve_references()
    member_config.seed = seed
    datas[seed] = task_data(task, member_config, model_cfg, workdir)
  data = datas[seeds[0]]
  run.write_config(config)

  msharding = _member_sharding(mesh, count)
  split = mesh.shape["data"] if msharding.spec == P("data") else 1
  repl = parallel.replicated(mesh)
  init_params = boxed_init(model_cfg)
  hp = _hparam_arrays(table)

  def optimizer(h):
    sched = member_schedule(config, h["learning_rate"], h["warmup_steps"])
    return make_optimizer(config, learning_rate=sched, weight_decay=h["weight_decay"]), sched

  def init_member(h):
    key = jax.random.PRNGKey(h["seed"])
    params = flax.linen.unbox(init_params(jax.random.fold_in(key, 0)))
    tx, _ = optimizer(h)
    return params, tx.init(params), jax.random.fold_in(key, 1)

  def init(h):
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

  abstract = jax.eval_shape(init, hp)
  shardings = jax.tree_util.tree_map(lambda _: msharding, abstract).replace(step=repl)
  state = jax.jit(init, out_shardings=shardings)(hp)
  checkpoints = run.checkpoints(config.keep_checkpoints)
  start = checkpoints.latest_step()
  if start is not None:
    target = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
    )
    state, start = resume.restore_verified(
        checkpoints,
        target,
        _non_finite_alive,
        does_not_fit="does not hold this population ({error}): resume with the population it "
        "was saved with, or use a new --workdir",
    )
    saved = jax.device_get(state.hparams)
    if any(not np.array_equal(saved[k], hp[k]) for k in hp):
      raise UserError(
          f"checkpoint step {start} in {checkpoints.directory} holds other members (seeds "
          "or hyperparameters differ): resume with the population it was saved with, or "
          "use a new --workdir"
      )
    note = f"resumed from step {start}"
  else:
    start, note = 0, "fresh start"

  loss_fn = make_loss_fn(task, model_cfg, config.label_smoothing, config.moe_aux_weight)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def member_step(params, opt_state, rng, alive, diverged_at, h, step, batch):
    tx, sched = optimizer(h)
    (_, sums), grads = grad_fn(params, batch, jax.random.fold_in(rng, step), h["z_loss"])
    weight = jnp.maximum(sums["weight"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / weight, grads)
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    loss, grad_norm = sums["loss"] / weight, optax.tree_utils.tree_norm(grads)
    ok = alive & jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
    diverged_at = jnp.where(alive & ~ok, step + 1, diverged_at)
    metrics = {
        "loss": loss,
        "nll": sums["nll"] / weight,
        "accuracy": sums["correct"] / weight,
        "log_z_squared": sums["z_loss"] / weight,
        "grad_norm": grad_norm,
        "lr": sched(step),
    }
    return (
        jax.tree_util.tree_map(keep, new_params, params),
        jax.tree_util.tree_map(keep, new_opt, opt_state),
        ok,
        diverged_at,
        metrics,
    )

  def train_step(state, batch):
    params, opt_state, alive, diverged_at, metrics = jax.vmap(
        member_step, in_axes=(0, 0, 0, 0, 0, 0, None, 0)
    )(
        state.params,
        state.opt_state,
        state.rng,
        state.alive,
        state.diverged_at,
        state.hparams,
        state.step,
        batch,
    )
    new = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        alive=alive,
        diverged_at=diverged_at,
    )
    return new, metrics

  train_step = jax.jit(
      train_step,
      in_shardings=(shardings, msharding),
      out_shardings=(shardings, msharding),
      donate_argnums=0,
  )
  eval_model = build_model(model_cfg)

  def member_eval(params, batch):
    (logits, targets, weights), inter = task.outputs(
        eval_model, {"params": params}, batch, {}, ["intermediates"]
    )
    sums = cross_entropy(logits, targets, weights)
    real = logits[..., : model_cfg.vocab_size].astype(jnp.float32)
    w = weights.astype(jnp.float32)
    sums["logit_sum"] = jnp.sum(jnp.mean(real, axis=-1) * w)
    sums["logit_max"] = jnp.max(real)
    return sums, inter["intermediates"]

  eval_step = jax.jit(
      jax.vmap(member_eval, in_axes=(0, None)),
      in_shardings=(shardings.params, repl),
      out_shardings=msharding,
  )

  def member_batch(step):
    per_seed = {s: datas[s].train_batch(step) for s in seeds}
    return {
        k: jax.device_put(np.stack([per_seed[m["seed"]][k] for m in table]), msharding)
        for k in per_seed[seeds[0]]
    }

  writer = metrics_lib.MetricsWriter(workdir, enabled=True)
  print(
      f"population of {count} {model_cfg.family} models ({len(seeds)} seeds x "
      + " x ".join(f"{len(_values(config, n))} {LISTS[n]}" for n in LISTS)
      + f"), split over {split} device(s); {data.summary}; {note}",
      flush=True,
  )
  stop_requests = StopRequests()
  results = [dict(m) for m in table]
  reported = set(int(i) for i in np.flatnonzero(~np.asarray(jax.device_get(state.alive))))
  end = min(config.stop_after or config.steps, config.steps)
  t0 = time.perf_counter()
  try:
    for step in range(start, end):
      state, metrics = train_step(state, member_batch(step))
      done = step + 1
      stop_now = stop_requests.stop_at(done)
      log_now, eval_now, save_now = step_events(config, done, end, stop_now)
      if log_now:
        values = jax.device_get(metrics)
        alive, diverged_at = jax.device_get((state.alive, state.diverged_at))
        for i, m in enumerate(table):
          line = {**m, **{k: float(v[i]) for k, v in values.items()}}
          line["diverged"] = not bool(alive[i])
          if line["diverged"]:
            line["diverged_at"] = int(diverged_at[i])
          writer.write(done, line, tb_prefix=f"member_{i:03d}/")
          results[i].update(line)
        for i in np.flatnonzero(~alive):
          if int(i) not in reported:
            reported.add(int(i))
            print(
                f"member {i} ({_describe(table[i])}) diverged at step {diverged_at[i]}: "
                "its state is frozen there; the others carry on",
                flush=True,
            )
        finite = [float(values["loss"][i]) for i in range(count) if alive[i]]
        print(
            f"step {done}: {int(alive.sum())}/{count} members training, best loss "
            f"{min(finite) if finite else float('nan'):.4f}, "
            f"{(time.perf_counter() - t0) / max(done - start, 1):.3f} s/step",
            flush=True,
        )
      if eval_now:
        for i, ev in enumerate(_evaluate(eval_step, state.params, data, count)):
          writer.write(done, {**table[i], **ev}, tb_prefix=f"member_{i:03d}/")
          results[i].update(ev)
      if save_now:
        checkpoints.save(done, state)
      if stop_now:
        checkpoints.close()
        raise UserError(
            f"interrupted ({stop_requests.signal_name or 'signal'}): saved step {done} in "
            f"{checkpoints.directory}; run the same command again to resume"
        )
  finally:
    stop_requests.restore()
    writer.close()
  checkpoints.close()
  print(
      f"run files: {workdir} (config.json, metrics.jsonl with one line per member, tb/, "
      "checkpoints/)"
  )
  return {"members": results, "step": max(start, end), "member_devices": split}


def _non_finite_alive(state) -> str | None:
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


def _describe(m: dict) -> str:
  return ", ".join(f"{k} {m[k]:g}" for k in ("seed", *HPARAMS))


def _evaluate(eval_step, params, data, count: int) -> list[dict]:
  """Held-out metrics per member: loss, accuracy, perplexity, output-logit mean and max, and
  per block the residual RMS and the largest attention logit (first held-out batch)."""
  totals, inter = None, None
  for batch in data.eval_batches:
    sums, it = jax.device_get(eval_step(params, batch))
    if totals is None:
      totals, inter = sums, it
      continue
    for k in sums:
      totals[k] = np.maximum(totals[k], sums[k]) if k == "logit_max" else totals[k] + sums[k]
  out = []
  for i in range(count):
    w = max(float(totals["weight"][i]), 1.0)
    loss = float(totals["loss"][i]) / w
    mine = jax.tree_util.tree_map(lambda a, i=i: a[i], inter)
    ev = {
        "eval_loss": loss,
        "eval_accuracy": float(totals["correct"][i]) / w,
        "eval_perplexity": math.exp(min(loss, 50.0)) if math.isfinite(loss) else loss,
        "eval_logit_mean": float(totals["logit_sum"][i]) / w,
        "eval_logit_max": float(totals["logit_max"][i]),
        "residual_rms": per_layer(mine, "residual_rms"),
    }
    logit_max = per_layer(mine, "attention_logit_max")
    if logit_max:
      ev["attention_logit_max"] = logit_max
    out.append(ev)
  return out
