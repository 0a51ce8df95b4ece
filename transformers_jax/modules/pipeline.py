"""Pipeline parallelism: a stack's blocks split over the `stage` mesh axis, the batch over
microbatches that flow from stage to stage.

Layout. The blocks' parameters are the scanned stack's own (`layers`, a leading axis of L
blocks) and the rule `layers -> stage` splits that axis over the S stages: stage s holds blocks
s L/S ... (s+1) L/S - 1, and a checkpoint holds the ordinary tree. Inside a stage the blocks run
as a scan (with the config's remat policy) and every other axis (fsdp, tensor, context,
expert) splits them as it would without stages.

Schedule. The batch is cut into M microbatches (microbatch m: rows m, m + M, m + 2M, ..., so
that every device keeps its own rows) and the stack runs for M R + S - 1 ticks. At each tick
every stage runs its blocks on the microbatch it holds (all stages at once: one program, the
stage axis a vmapped and sharded leading axis), then the states shift one stage on (a
`jnp.roll` over the sharded axis: XLA sends each stage's activations to the next device group,
a collective-permute). Stage 0 takes microbatch t mod M at tick t; the last stage's outputs
are kept per microbatch, and are the stack's output after the last pass.

  GPipe (repeats R = 1): each stage runs L/S consecutive blocks once per microbatch.
  Circular (R > 1, "interleaved"): each microbatch passes the ring of stages R times, stage s
  running blocks (r S + s) K ... (r S + s + 1) K - 1 on pass r (K = L / (S R)); a pass's output
  waits in the per-microbatch buffer until stage 0 is free for it (needs M >= S). The state
  keeps the blocks in their natural order, so each step regroups them per stage: XLA moves
  each device's parameter shards there, and their gradients back.

Every stage is busy in M R of the M R + S - 1 ticks: the bubble, the idle fraction, is
(S - 1) / (M R + S - 1), which is (S - 1) / (M + S - 1) for GPipe and shrinks with R. The
embedding and the head run outside the pipeline, on every stage's devices alike.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

STAGE_AXIS = "stage"
# What a block sows (per layer) that the pipeline gathers over its ticks, when mutable.
SOWN = ("intermediates", "losses", "moe_stats")


def stage_count() -> int:
  """The size of the `stage` axis of the mesh being traced under (1 without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or STAGE_AXIS not in mesh.axis_names:
    return 1
  return int(mesh.shape[STAGE_AXIS])


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
  """The fraction of a step each stage is idle: (S - 1) / (M R + S - 1)."""
  return (stages - 1) / (microbatches * repeats + stages - 1)


def microbatches_of(cfg, stages: int) -> int:
  """The schedule's microbatches (model.pipeline_microbatches; 0 = one per stage)."""
  return cfg.pipeline_microbatches or stages


def schedule_problem(num_layers: int, stages: int, microbatches: int, repeats: int):
  """(field, problem and fix) of a schedule that cannot run this stack, or None."""
  if repeats < 1 or microbatches < 0:
    return "pipeline.repeats", "repeats >= 1 and microbatches >= 0 (0 = one per stage)"
  if num_layers % (stages * repeats):
    what = f"{stages} stages" + (f" x {repeats} repeats" if repeats > 1 else "")
    return (
        "mesh.stage",
        f"{num_layers} blocks do not split evenly over {what}: choose a stage count"
        + (" and repeats" if repeats > 1 else "")
        + f" whose product divides {num_layers}",
    )
  if repeats > 1 and (microbatches or stages) < stages:
    return (
        "pipeline.microbatches",
        f"the circular schedule (repeats={repeats}) needs at least as many microbatches as "
        f"stages ({stages}): raise pipeline.microbatches",
    )
  return None


def split_microbatches(a, count: int):
  """[B, ...] -> [M, B/M, ...]: microbatch m is rows m, m + M, ... (each device keeps its rows)."""
  return jnp.swapaxes(a.reshape(a.shape[0] // count, count, *a.shape[1:]), 0, 1)


def join_microbatches(a):
  """The inverse of split_microbatches: [M, B/M, ...] -> [B, ...]."""
  return jnp.swapaxes(a, 0, 1).reshape(a.shape[0] * a.shape[1], *a.shape[2:])


def _activation_names(ndim: int, lead: str | None):
  return (lead, "act_batch", "act_length") + (None,) * (ndim - 4) + ("act_embed",)[: ndim - 3]


def _constrain(tree, lead):
  """Per-stage ([S, mb, ...], lead 'layers': over `stage`) or per-microbatch (lead None)
  activations kept split over the batch axes like the stack's own."""
  return jax.tree_util.tree_map(
      lambda a: nn.with_logical_constraint(a, _activation_names(a.ndim, lead))
      if a.ndim >= 4
      else a,
      tree,
  )


def _by_stage(a, stages: int, repeats: int):
  """A block parameter [L, ...] -> [S, R, K, ...]: stage s, pass r holds blocks (r S + s) K + k."""
  per = a.shape[0] // (stages * repeats)
  a = jnp.swapaxes(a.reshape(repeats, stages, per, *a.shape[1:]), 0, 1)
  spec = P(STAGE_AXIS, *([P.UNCONSTRAINED] * (a.ndim - 1)))
  return jax.lax.with_sharding_constraint(a, spec)


def run(cfg, layer_fn, params, x, inputs, batch: int, rng):
  """The stack's output for `x` (a pytree of [B, ...] arrays: the residual stream and what the
  blocks carry with it) through the blocks of `params` (every leaf [L, ...]), pipelined over
  the mesh's stages. `layer_fn(block_params, x, inputs, index, rng) -> (x, sown)` runs one
  block (index: its position in the stack; `sown`: the collections it sowed); `inputs` are
  what every block reads besides the stream (mask fields, positions, the encoder's output):
  leaves with a leading batch axis of `batch` rows follow their microbatch, the rest are shared.
  Returns (output, {collection: tree of [L, ...] means over microbatches} of what was sown)."""
  stages = stage_count()
  num_layers = jax.tree_util.tree_leaves(params)[0].shape[0]
  count = microbatches_of(cfg, stages)
  repeats = cfg.pipeline_repeats
  per_stage = num_layers // (stages * repeats)
  ticks = count * repeats + stages - 1
  weights = jax.tree_util.tree_map(lambda a: _by_stage(a, stages, repeats), params)
  follows = lambda a: hasattr(a, "ndim") and a.ndim >= 1 and a.shape[0] == batch  # noqa: E731
  split = lambda a: split_microbatches(a, count) if follows(a) else a  # noqa: E731
  streams = _constrain(jax.tree_util.tree_map(split, x), None)
  per_microbatch = jax.tree_util.tree_map(split, inputs)
  split_flags = jax.tree_util.tree_map(follows, inputs)

  def stage(block_params, h, stage_inputs, first, key):
    """One stage's blocks (a scan) on its microbatch."""

    def body(carry, xs):
      p, k = xs
      return layer_fn(p, carry, stage_inputs, first + k, jax.random.fold_in(key, k))

    return jax.lax.scan(body, h, (block_params, jnp.arange(per_stage)))

  if cfg.remat == "full":  # keep nothing: a tick keeps only its stages' inputs, and recomputes
    stage = jax.checkpoint(stage, prevent_cse=False)
  run_stages = jax.vmap(stage, spmd_axis_name=STAGE_AXIS)
  indices = jnp.arange(stages)

  def inputs_at(m):  # a stage's microbatch of the per-row inputs
    return jax.tree_util.tree_map(lambda a, f: a[m] if f else a, per_microbatch, split_flags)

  def tick(carry, t):
    state, done, totals = carry
    first_mb, first_pass = t % count, t // count
    fresh = jax.tree_util.tree_map(lambda a: a[first_mb], streams)
    again = jax.tree_util.tree_map(lambda a: a[first_mb], done)
    entering = jax.tree_util.tree_map(lambda f, g: jnp.where(first_pass == 0, f, g), fresh, again)
    state = jax.tree_util.tree_map(lambda s, e: s.at[0].set(e), state, entering)
    step = t - indices  # where each stage is in its own sequence of M R microbatch passes
    valid = (step >= 0) & (step < count * repeats)
    step = jnp.clip(step, 0, count * repeats - 1)
    m, r = step % count, step // count
    stage_weights = jax.vmap(lambda w, r: jax.tree_util.tree_map(lambda a: a[r], w))(weights, r)
    stage_inputs = jax.vmap(inputs_at)(m)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(rng, t), i))(indices)
    out, sows = run_stages(
        stage_weights, state, stage_inputs, (r * stages + indices) * per_stage, keys
    )
    out = _constrain(out, "layers")
    last = stages - 1
    done = jax.tree_util.tree_map(
        lambda d, o: d.at[m[last]].set(jnp.where(valid[last], o[last], d[m[last]])), done, out
    )
    totals = jax.tree_util.tree_map(
        lambda tot, s: jax.vmap(lambda a, v, i, ok: a.at[i].add(jnp.where(ok, v, 0)))(
            tot, s, r, valid
        ),
        totals,
        sows,
    )
    state = _constrain(jax.tree_util.tree_map(lambda a: jnp.roll(a, 1, axis=0), out), "layers")
    return (state, done, totals), None

  state = _constrain(
      jax.tree_util.tree_map(lambda a: jnp.zeros((stages, *a.shape[1:]), a.dtype), streams),
      "layers",
  )
  sow_shapes = jax.eval_shape(
      lambda: run_stages(
          jax.tree_util.tree_map(lambda a: a[:, 0], weights),
          state,
          jax.vmap(inputs_at)(indices * 0),
          indices,
          jax.vmap(lambda i: jax.random.fold_in(rng, i))(indices),
      )[1]
  )
  totals = jax.tree_util.tree_map(
      lambda s: jnp.zeros((stages, repeats, *s.shape[1:]), s.dtype), sow_shapes
  )
  (_, done, totals), _ = jax.lax.scan(tick, (state, streams, totals), jnp.arange(ticks))
  out = jax.tree_util.tree_map(join_microbatches, done)

  def per_layer(a):  # [S, R, K, ...] -> [L, ...] in block order, the mean over microbatches
    a = jnp.swapaxes(a, 0, 1).reshape(num_layers, *a.shape[3:])
    return a / count if jnp.issubdtype(a.dtype, jnp.inexact) else a

  return out, jax.tree_util.tree_map(per_layer, totals)


def schedule_report(cfg, stages: int) -> dict:
  """What a compile report says of the schedule (cfg: the model config the step was built
  with, its stacks' depths and the pipeline fields): stages, microbatches, repeats, blocks per
  stage and pass, the schedule's ticks and its bubble fraction."""
  count, repeats = microbatches_of(cfg, stages), cfg.pipeline_repeats
  depths = (
      (cfg.encoder_layers, cfg.decoder_layers)
      if cfg.family == "encoder_decoder"
      else (cfg.num_layers,)
  )
  return {
      "schedule": "gpipe" if repeats == 1 else "circular",
      "stages": stages,
      "microbatches": count,
      "repeats": repeats,
      "blocks_per_stage_pass": [depth // (stages * repeats) for depth in depths],
      "ticks": count * repeats + stages - 1,
      "bubble_fraction": bubble_fraction(stages, count, repeats),
  }
