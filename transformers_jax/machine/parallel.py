"""Meshes and logical-axis rules: how parameters and activations map onto devices.

Parameters carry logical names (`embed`, `heads`, `mlp`, …; activations `act_*`); one rules table
maps each name to a mesh axis (or None: replicated). The mesh has six named axes:
  data    — pure data parallelism (parameters replicated)
  stage   — pipeline stages: each holds a contiguous share of a scanned stack's blocks (the
            `layers` axis) and microbatches flow from stage to stage (modules/pipeline.py)
  fsdp    — data parallelism with parameters and optimizer state sharded (ZeRO-3 style)
  context — the tokens of each sequence (activations' `act_length`); attention gathers keys
            and values over it (modules/context.py)
  tensor  — Megatron-style split of attention heads and the feed-forward hidden dimension
  expert  — mixture-of-experts experts; the batch is split over it too, and the MoE layers
            send each token to the devices of its experts and back (modules/moe_ragged.py)
The batch is split over data × fsdp × expert. Axes are laid out in this order, the last ones on the
nearest chips: context and tensor, whose collectives run in every layer, get the fastest links;
stage, whose sends run once per microbatch and stage, may cross slices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "stage", "fsdp", "context", "tensor", "expert")
# the axes that may span slices (mesh.dcn_data, mesh.dcn_stage, mesh.dcn_fsdp)
DCN_AXES = ("data", "stage", "fsdp")
SLICE_FIELDS = ("num_slices", "dcn_data", "dcn_stage", "dcn_fsdp")
BATCH_AXES = ("data", "fsdp", "expert")

# logical name -> mesh axis (None = replicated)
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    # the output side of a D -> D head transform (pooler, MLM transform): kept whole, so that
    # what follows sees the residual-stream layout, not an FFN hidden layer's
    ("embed_out", None),
    ("experts", "expert"),
    # multi-head latent attention's latents (the input of its up-projections): split like embed
    ("latent", "fsdp"),
    ("classes", None),
    ("layers", "stage"),  # a scanned stack's blocks: split over pipeline stages
    ("position", None),
    ("type_vocab", None),
    ("patch", None),
    ("act_batch", BATCH_AXES),
    ("act_length", "context"),  # the sequence: split only when mesh.context > 1
    # the residual stream's width, split over tensor as MaxText's activation_embed rule does:
    # without it the 32B recipe on v5p:4x4x4 (fsdp 16 x tensor 4) is refused at 128 GiB per
    # chip, with it XLA's peak is 85.5 GiB (experiments/results/scale/maxtext.md); GPT-3 175B
    # there (64 x 2,048 tokens, full remat) 67.7 -> 53.8 GiB; a size-1 tensor axis leaves it whole
    ("act_embed", "tensor"),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),  # logits: split over the vocabulary like the unembedding
)


MESH_PRESETS = {
    "data": {"data": -1, "fsdp": 1, "context": 1, "tensor": 1, "expert": 1},  # pure data parallel
    "fsdp": {"data": 1, "fsdp": -1, "context": 1, "tensor": 1, "expert": 1},  # ZeRO-3 style
    "fsdp_tensor": {"data": 1, "fsdp": -1, "context": 1, "tensor": 2, "expert": 1},  # + Megatron
}


def resolve_preset(axes: Mapping[str, object]) -> dict[str, int]:
  """`mesh.preset` names a layout; axis sizes given beside it (other than 1) override it."""
  axes = dict(axes)
  axes.pop("topology", None)  # which devices, not how they are split (see train/compile.py)
  for key in SLICE_FIELDS:  # how slices are joined: make_mesh reads them
    axes.pop(key, None)
  preset = axes.pop("preset", "") or ""
  if not preset:
    return axes
  if preset not in MESH_PRESETS:
    raise ValueError(f"mesh.preset={preset!r}: choose one of {', '.join(MESH_PRESETS)} (or '')")
  out = dict(MESH_PRESETS[preset])
  out.update({a: n for a, n in axes.items() if n not in (1, -1) or a not in out})
  return out


def mesh_shape(axes: Mapping[str, int], num_devices: int) -> dict[str, int]:
  """Resolve `-1` ("the rest") and check the product equals the device count. `context` and
  `stage` are listed only when > 1; make_mesh gives the mesh every axis either way."""
  axes = resolve_preset(axes)
  sizes = {a: int(axes.get(a, 1)) for a in MESH_AXES}
  unknown = sorted(set(axes) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"mesh.{unknown[0]}: unknown mesh axis; axes are {', '.join(MESH_AXES)}")
  rest = [a for a, n in sizes.items() if n == -1]
  if len(rest) > 1:
    raise ValueError(f"mesh: only one axis may be -1, got {', '.join(rest)}")
  for a, n in sizes.items():
    if n == 0 or n < -1:
      raise ValueError(f"mesh.{a}={n}: axis sizes are positive, or -1 for the rest")
  if sizes["stage"] > 1 and num_devices % sizes["stage"]:
    raise ValueError(
        f"mesh.stage={sizes['stage']}: the pipeline stages do not divide the {num_devices} "
        "devices: choose a stage count that divides them"
    )
  known = math.prod(n for n in sizes.values() if n != -1)
  if rest:
    if num_devices % known:
      raise ValueError(
          f"mesh: the fixed axes multiply to {known}, which does not divide the "
          f"{num_devices} devices: change the mesh sizes"
      )
    sizes[rest[0]] = num_devices // known
  if math.prod(sizes.values()) != num_devices:
    raise ValueError(
        f"mesh {sizes} needs {math.prod(sizes.values())} devices but there are "
        f"{num_devices}: make the axis sizes multiply to {num_devices} (or use -1)"
    )
  for axis in ("context", "stage"):
    if sizes[axis] == 1:
      del sizes[axis]
  return sizes


def dcn_shape(axes: Mapping[str, int], num_slices: int) -> dict[str, int]:
  """{axis: slices it spans} for the axes DCN_AXES names (`mesh.dcn_data`, `mesh.dcn_stage`,
  `mesh.dcn_fsdp`; -1 = the rest), checked to multiply to `num_slices`."""
  dcn = {a: int(axes.get(f"dcn_{a}", -1 if a == "data" else 1)) for a in DCN_AXES}
  rest = [a for a, n in dcn.items() if n == -1]
  if len(rest) > 1 or any(n == 0 or n < -1 for n in dcn.values()):
    raise ValueError(f"mesh: dcn sizes {dcn}: positive, or -1 (the rest) for one axis")
  known = math.prod(n for n in dcn.values() if n != -1)
  if rest and num_slices % known == 0:
    dcn[rest[0]] = num_slices // known
  if math.prod(dcn.values()) != num_slices:
    raise ValueError(
        f"mesh: dcn_data x dcn_stage x dcn_fsdp = {' x '.join(str(n) for n in dcn.values())} "
        f"must equal mesh.num_slices={num_slices}: set them to multiply to it (or dcn_data=-1)"
    )
  return dcn


def make_mesh(axes: Mapping[str, int], devices=None) -> Mesh:
  """The mesh over `devices` (default: all of them), laid onto the physical topology: on TPUs
  each mesh axis takes whole torus axes where it can (so its collectives ride neighbouring
  links), splitting a physical axis only where the sizes require it.

  With `num_slices` > 1 the devices form that many slices joined by the data-center network
  (DCN): the axis sizes are per slice (ICI), `dcn_data` / `dcn_stage` / `dcn_fsdp` say how many
  slices the data, stage and fsdp axes span, and each mesh axis is the product, laid out so
  that only those axes' collectives cross slices. TPU devices know their slice (`slice_index`: jax's hybrid
  mesh places them); others (simulated CPU devices) are taken as consecutive equal groups."""
  devices = jax.devices() if devices is None else list(devices)
  slices = int(axes.get("num_slices", 1))
  if slices < 1 or len(devices) % slices:
    raise ValueError(
        f"mesh.num_slices={slices}: must be >= 1 and divide the {len(devices)} devices"
    )
  if slices > 1:
    return _multislice_mesh(axes, devices, slices)
  spans = [f for f in ("dcn_fsdp", "dcn_stage") if int(axes.get(f, 1)) != 1]
  if spans or int(axes.get("dcn_data", -1)) not in (-1, 1):
    field = spans[0] if spans else "dcn_data"
    raise ValueError(
        f"mesh.{field}={axes[field]}: says how many slices an axis spans, and mesh.num_slices=1"
        f" (one slice): set --config.mesh.num_slices to the slices, or leave {field} at its "
        "default"
    )
  sizes = mesh_shape(axes, len(devices))
  shape = tuple(sizes.get(a, 1) for a in MESH_AXES)
  from jax.experimental import mesh_utils

  try:
    array = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):
    try:
      array = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):  # no physical layout known
      array = np.asarray(devices).reshape(shape)
  return Mesh(array, MESH_AXES)


def _multislice_mesh(axes, devices, slices: int) -> Mesh:
  from jax.experimental import mesh_utils

  dcn = dcn_shape(axes, slices)
  per_slice = mesh_shape(axes, len(devices) // slices)
  ici = tuple(per_slice.get(a, 1) for a in MESH_AXES)
  dcn_shape_ = tuple(dcn.get(a, 1) for a in MESH_AXES)
  known = {getattr(d, "slice_index", None) for d in devices}
  if None not in known and len(known) == slices:
    array = mesh_utils.create_hybrid_device_mesh(
        ici, dcn_shape_, devices, allow_split_physical_axes=True
    )
  else:  # no slice_index: consecutive groups of devices stand for the slices
    n = len(devices) // slices
    granules = np.empty(slices, dtype=object)
    for i in range(slices):
      granules[i] = np.asarray(devices[i * n : (i + 1) * n], dtype=object).reshape(ici)
    grid = np.stack(list(granules)).reshape(*dcn_shape_, *ici)  # [*dcn, *ici]
    k = len(MESH_AXES)  # interleave (dcn_0, ici_0, dcn_1, ici_1, ...), then merge the pairs
    order = [i for pair in zip(range(k), range(k, 2 * k)) for i in pair]
    array = grid.transpose(order).reshape([d * i for d, i in zip(dcn_shape_, ici)])
  return Mesh(array, MESH_AXES)


def rule_names() -> tuple[str, ...]:
  return tuple(name for name, _ in DEFAULT_RULES)


def rules(overrides: Mapping[str, object] | None = None):
  """The rules table with config overrides: logical name -> None (keep the default rule), ''
  (replicate), a mesh axis, or several ("data,fsdp" or a tuple)."""
  table = dict(DEFAULT_RULES)
  for name, axis in (overrides or {}).items():
    if name not in table:
      raise ValueError(
          f"rules.{name}: no such logical axis; the names are " f"{', '.join(rule_names())}"
      )
    if axis is None:
      continue
    axes = tuple(a.strip() for a in axis.split(",")) if isinstance(axis, str) else tuple(axis)
    axes = tuple(a for a in axes if a)
    for a in axes:
      if a not in MESH_AXES:
        raise ValueError(
            f"rules.{name}={axis!r}: {a!r} is not a mesh axis; use '' (replicate) "
            f"or some of {', '.join(MESH_AXES)}"
        )
    table[name] = None if not axes else (axes[0] if len(axes) == 1 else axes)
  return tuple(table.items())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def logical_shardings(abstract_boxed, mesh: Mesh, rule_table):
  """NamedShardings for a tree whose leaves may be boxed with logical names."""
  specs = nn.get_partition_spec(abstract_boxed)
  return nn.logical_to_mesh_sharding(specs, mesh, rule_table)


def put_batch(batch: Mapping[str, np.ndarray], mesh: Mesh):
  """This process's slice of a global batch -> global jax Arrays split over the batch axes.

  With one process the slice is the whole batch; with many, each process passes its own rows.
  """
  sharding = batch_sharding(mesh)
  return {
      k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()
  }


def process_rows(mesh: Mesh, batch_size: int) -> tuple[int, int]:
  """[start, stop) of the rows of a global batch that this process feeds to its devices (what
  `put_batch` expects from it), from the batch sharding itself."""
  if jax.process_count() == 1:
    return 0, batch_size
  index_map = batch_sharding(mesh).addressable_devices_indices_map((batch_size,))
  spans = sorted(
      {
          (s[0].start or 0, batch_size if s[0].stop is None else s[0].stop)
          for s in index_map.values()
      }
  )
  start, stop = spans[0][0], spans[-1][1]
  covered = sum(b - a for a, b in spans)
  if covered != stop - start:
    raise ValueError(
        f"mesh {dict(mesh.shape)}: this process's devices hold rows that are not contiguous in "
        "the batch: order the mesh so that each process's devices are neighbours on data x fsdp"
    )
  return start, stop


def agree(flag: bool) -> bool:
  """Process 0's `flag`, on every process (a decision only process 0 can take, e.g. a lock)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils

  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def gather_to_host(tree):
  """A tree of arrays as numpy on every process, gathered from wherever they are sharded (all
  processes must call it). With one process, the arrays come back unchanged."""
  if jax.process_count() == 1:
    return tree
  from jax.experimental import multihost_utils

  return multihost_utils.process_allgather(tree, tiled=True)


def check_divisible(abstract_boxed, mesh: Mesh, rule_table) -> None:
  """Every sharded dimension must divide evenly by its mesh axes: a clear error before compiling."""
  table = dict(rule_table)
  for path, leaf in jax.tree_util.tree_flatten_with_path(
      abstract_boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
  )[0]:
    if not isinstance(leaf, nn.LogicallyPartitioned):
      continue
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    for dim, logical in zip(leaf.value.shape, leaf.names):
      axes = table.get(logical)
      if axes is None:
        continue
      axes = (axes,) if isinstance(axes, str) else tuple(axes)
      size = math.prod(mesh.shape[a] for a in axes)
      if dim % size:
        raise ValueError(
            f"parameter {name}: dimension '{logical}' of size {dim} does not divide over mesh "
            f"axis {'×'.join(axes)} of size {size}: change the mesh or the model size, or map "
            f"'{logical}' elsewhere with --config.rules.{logical}=''"
        )
