"""`--fit`: find the layout of a train step that fits in device memory with the least
recomputation, by compiling candidates with the real compiler (train/compile.py's report).

The fields the user set on the command line stay as given; the others that SEARCH_SPACE names
are searched. The search is one walk: it starts from every searched knob's first (cheapest)
value and moves one knob at a time to its next value, knob after knob in SEARCH_SPACE's order,
keeping a move when it lowered the per-device peak (by KEEP_GAIN at least: the winning flags
hold only the moves that helped), and stops at the first layout whose peak is within the
chip's memory. The order is that of what a
move costs: first what costs nothing or next to nothing (a sharding rule, the loss a chunk at a
time, ring attention), then recomputation from the least upward (remat policies), then host
transfers (offloading the optimizer state, then the parameters), then smaller micro-batches
(gradient accumulation), then pipeline stages (mesh.stage, whose bubble idles chips). Each compile's report is kept in a JSON file keyed by the whole
configuration and the devices (machine/compile_cache.ReportCache), so the same search again
compiles nothing.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable

import jax

from transformers_jax.machine import compile_cache, hardware, parallel

MAX_COMPILES = 14  # layouts one search may compile (cached ones are free)
KEEP_GAIN = 0.01  # a move that lowers the peak by less than this fraction is not kept
# loop-free FLOPs programs keep sequences to this length: einsum attention over a million
# tokens would not compile, and the policies' ratio to each other is what they are read for
FLOPS_PROGRAM_MAX_TOKENS = 8192


@dataclasses.dataclass(frozen=True)
class Knob:
  """One searched field: `values` from the cheapest (the start of the walk) to the one that
  saves the most memory; `usable(config, devices)` filters them (a value that cannot work for
  this config is never compiled); `hint` names the knob in the refusal of a step that does not
  fit."""

  field: str
  values: tuple
  hint: str
  usable: Callable = lambda value, config, devices: True


def _axis(config, name: str) -> int:
  return int(parallel.resolve_preset(config.mesh.to_dict()).get(name, 1))


def _context_only(value, config, devices) -> bool:
  return value in (None, "all_gather") or _axis(config, "context") > 1


def _chunks_divide(value, config, devices) -> bool:
  from transformers_jax.config import ModelConfig
  from transformers_jax.tasks import task_for

  task = task_for(ModelConfig.from_dict(config.model), config)
  return value == 1 or (task.chunked_loss and config.seq_len % value == 0)


def _host_memory(value, config, devices) -> bool:
  """Host offload where the compiled-for devices have pinned host memory (TPU, GPU)."""
  if not value:
    return True
  # a TPU topology compiled ahead of time is TPU; a CPU's "host memory" is its own
  return bool(config.mesh.get("topology", "")) or devices[0].platform in ("tpu", "gpu", "cuda")


def _accumulation_divides(value, config, devices) -> bool:
  """batch_size splits into `value` micro-batches that each split over the batch axes."""
  if value == 1:
    return True
  slices = int(config.mesh.get("num_slices", 1) or 1)
  sizes = parallel.mesh_shape(config.mesh.to_dict(), len(devices) // slices)
  shards = math.prod(sizes.get(a, 1) for a in parallel.BATCH_AXES) * slices
  return config.batch_size % value == 0 and (config.batch_size // value) % shards == 0


def _stages_usable(value, config, devices) -> bool:
  """`value` pipeline stages that the mesh and the model accept (train/field_checks.py's
  check_pipeline: a scanned stack of one run of blocks whose depth the stages divide, no
  population) with the other axes resolving over the devices that remain."""
  if value == 1:
    return True
  from transformers_jax.config import ModelConfig
  from transformers_jax.train import field_checks

  staged = with_values(config, {"mesh.stage": value})
  slices = int(config.mesh.get("num_slices", 1) or 1)
  try:
    parallel.mesh_shape(staged.mesh.to_dict(), len(devices) // slices)
    field_checks.check_pipeline(staged, ModelConfig.from_dict(staged.model))
  except ValueError:
    return False
  return True


SEARCH_SPACE: tuple[Knob, ...] = (
    # parameters and optimizer state split over the context axis too (MaxText's embed rule for
    # long context); the activations' embedding is split over tensor by default (parallel.py)
    Knob("rules.embed", (None, "fsdp,context"), "--config.rules.embed=fsdp,context", _context_only),
    Knob(
        "loss_chunks", (1, 4, 16), "--config.loss_chunks (logits a chunk at a time)", _chunks_divide
    ),
    Knob(
        "model.context_strategy",
        ("all_gather", "ring"),
        "--config.model.context_strategy=ring",
        _context_only,
    ),
    Knob(
        "model.remat",
        ("none", "minimal", "save_dot_except_mlpwi", "save_dot_except_mlp", "full"),
        "--config.model.remat (minimal, save_dot_except_mlpwi, ..., full: recompute more)",
    ),
    Knob(
        "host_offload",
        ("", "optimizer", "optimizer,params"),
        "--config.host_offload=optimizer (or optimizer,params)",
        _host_memory,
    ),
    Knob(
        "grad_accum_steps",
        (1, 2, 4, 8),
        "--config.grad_accum_steps (smaller micro-batches)",
        _accumulation_divides,
    ),
    # pipeline stages last: a schedule's bubble idles chips, which costs more than any move above
    Knob("mesh.stage", (1, 2, 4, 8), "--config.mesh.stage (pipeline stages)", _stages_usable),
)


def get(config, field: str):
  for key in field.split("."):
    config = config[key]
  return config


def with_values(config, changes: dict):
  """A copy of `config` with `changes` ({dotted field: value}) set."""
  out = config.copy_and_resolve_references()
  for field, value in changes.items():
    *groups, name = field.split(".")
    node = out
    for g in groups:
      node = node[g]
    node[name] = value
  return out


def searched(config, user_fields, devices) -> list[tuple[str, list]]:
  """[(field, its usable values, cheapest first)] of the knobs searched for `config`: those the
  user did not set, with a choice to make (or a start that differs from the config's value)."""
  knobs = []
  for knob in SEARCH_SPACE:
    if knob.field in user_fields:
      continue
    values = [v for v in knob.values if knob.usable(v, config, devices)]
    if len(values) > 1 or (values and get(config, knob.field) != values[0]):
      knobs.append((knob.field, values))
  return knobs


def moves(knobs) -> int:
  """How many layouts a walk over `knobs` can try: the start, then each later value."""
  return 1 + sum(len(values) - 1 for _, values in knobs)


def hints(config, devices) -> list[str]:
  """The knobs that could still lower the memory of `config`'s step: those whose value is
  not yet their last usable one (what --fit would try)."""
  out = []
  for knob in SEARCH_SPACE:
    values = [v for v in knob.values if knob.usable(v, config, devices)]
    current = get(config, knob.field)
    if len(values) > 1 and current != values[-1]:
      out.append(knob.hint)
  return out


def flags_text(changes: dict) -> str:
  """{field: value} as command-line flags ("" for none)."""
  return " ".join(f"--config.{f}={'' if v is None else v}" for f, v in changes.items())


def peak_gib(report: dict) -> float | None:
  """The figure `fits` reads: XLA's own peak, else the estimate (a refusal's included). On a
  CPU the estimate: XLA's CPU peak counts the arguments alone, none of the temporaries."""
  estimate = report.get("per_device_peak_estimate_gib")
  if str(report.get("device_kind", "")).lower() == "cpu":
    return estimate
  return report.get("per_device_peak_xla_gib", estimate)


def gib(x: float) -> str:
  """A size in GiB, to 3 significant figures below 100 ("85.5 GiB", "0.0101 GiB")."""
  return f"{x:.1f} GiB" if abs(x) >= 100 else f"{x:.3g} GiB"


class Searcher:
  """Compiles (or reads from the cache) one config's step; counts what it compiled."""

  def __init__(self, devices, cache: compile_cache.ReportCache):
    self.devices, self.cache = devices, cache
    self.compiled = self.cached = 0

  def report(self, config, devices=None) -> tuple[dict, bool]:
    """(the compile report, whether it came from the cache). Errors other than a memory refusal
    (a layout the config checks refuse) come back as {"error": ...}."""
    from transformers_jax.train import compile as compile_step

    devices = self.devices if devices is None else devices
    key = compile_cache.report_key(config, devices)
    hit = self.cache.get(key)
    if hit is not None:
      self.cached += 1
      return hit, True
    self.compiled += 1
    start = time.perf_counter()
    try:
      result = compile_step.report(config, devices, verbose=False)
    except compile_step.OutOfMemory as refused:
      result = refused.report
    except ValueError as e:  # the layout is not valid for this config (checked before compiling)
      result = {"error": str(e), "compile_s": round(time.perf_counter() - start, 2)}
    jax.clear_caches()
    self.cache.put(key, result)
    return result, False


def flops_per_model_flop(searcher: Searcher, config) -> float | str:
  """The compiled FLOPs per model FLOP of `config`'s whole step (as scripts/plan_scale.py
  measures them): XLA's count of two loop-free programs, the step's shape with 1 and 2 unrolled
  layers, the logits whole, einsum attention, plain data parallelism over 4 chips of the same
  TPU generation (or all the host's devices), one sequence each. Their difference is one
  layer's FLOPs with whatever the remat policy recomputes; the rest is embedding, head and loss;
  L layers are rest + L x layer. Divided by the same for the model's own count (the MFU
  figures'). A text saying why where a program has loops or does not compile."""
  topology = config.mesh.get("topology", "")
  if topology:
    generation, shape = topology.split(":")
    small = f"{generation}:{'2x2x1' if shape.count('x') == 2 else '2x2'}"
    devices = hardware.topology_devices(small)
  else:
    small, devices = "", searcher.devices
  length = min(config.seq_len, FLOPS_PROGRAM_MAX_TOKENS)
  base = {
      "model.scan_layers": False,
      "loss_chunks": 1,
      "model.attention_impl": "einsum",
      "model.context_strategy": "all_gather",  # (no context axis to pass blocks around)
      "mesh.topology": small,
      "batch_size": len(devices),
      "seq_len": length,
      "grad_accum_steps": 1,
      "host_offload": "",
      "mesh.preset": "",
      "mesh.data": len(devices),
      "mesh.fsdp": 1,
      "mesh.tensor": 1,
      "mesh.context": 1,
      "mesh.expert": 1,
      "mesh.num_slices": 1,
      "mesh.dcn_data": -1,
      "mesh.dcn_fsdp": 1,
  }
  xla, model = {}, {}
  for depth in (1, 2):
    program = with_values(config, {**base, "model.num_layers": depth})
    result, _ = searcher.report(program, devices)
    xla[depth] = result.get("xla_flops_per_device_per_step")
    model[depth] = result.get("model_flops_per_device_per_step")
    if xla[depth] is None:
      return str(result.get("error") or result.get("xla_flops_omitted") or "no FLOP count")[:200]
  layers = config.model.num_layers
  whole = lambda f: f[1] + (layers - 1) * (f[2] - f[1])  # noqa: E731
  return round(whole(xla) / whole(model), 4)


class NoFit(Exception):
  """No layout tried fits: `report` is the closest one's, with the search in it."""

  def __init__(self, message: str, report: dict):
    super().__init__(message)
    self.report = report


def search(
    config,
    user_fields,
    devices=None,
    memory_gib: float | None = None,
    cache_path: str | None = None,
    max_compiles: int = MAX_COMPILES,
    log=lambda line: print(line, file=sys.stderr, flush=True),
) -> dict:
  """Walk the layouts (see the module's doc) until one fits in `memory_gib` per device (default:
  the chip's HBM). Returns the fitting layout's compile report with `fit` (the tries, the flags
  to paste, the compile counts) and `flops_per_model_flop`; raises NoFit when none fits."""
  from transformers_jax.train import compile as compile_step

  devices = compile_step.devices_for(config) if devices is None else devices
  if memory_gib is None:
    topology = config.mesh.get("topology", "")
    chip = (
        hardware.chip_for_topology(topology)
        if topology
        else hardware.chip_for_kind(devices[0].device_kind)
    )
    if chip is None:
      raise ValueError(
          f"--fit: {devices[0].device_kind} devices have no known memory size: give the memory "
          "per device to fit in with --fit_memory_gib (e.g. 16)"
      )
    memory_gib = chip.hbm_gib
  searcher = Searcher(devices, compile_cache.ReportCache(cache_path))
  knobs = searched(config, set(user_fields), devices)
  total = moves(knobs)
  layout = {field: values[0] for field, values in knobs}
  tries, winner, kept_peak = [], None, None
  for changes in [dict(layout)] + [{f: v} for f, values in knobs for v in values[1:]]:
    if searcher.compiled >= max_compiles:
      log(f"fit: stopped after {max_compiles} compiles (--fit_max_compiles)")
      break
    changes = {**layout, **changes}
    candidate = with_values(config, changes)
    result, hit = searcher.report(candidate)
    peak = peak_gib(result)
    fits = peak is not None and "error" not in result and peak <= memory_gib
    moved = {f: v for f, v in changes.items() if get(config, f) != v}
    tries.append({"flags": flags_text(moved), "changes": changes, "peak_gib": peak, "fits": fits})
    if "error" in result:
      tries[-1]["error"] = result["error"][:300]
    how = "cached" if hit else f"{result.get('compile_s', 0):.0f} s"
    shown = "refused by the config checks" if peak is None else f"peak {gib(peak)}"
    log(
        f"fit {len(tries)}/{total}: {flags_text(moved) or '(as given)'} -> {shown} of "
        f"{gib(memory_gib)}: {'fits' if fits else 'does not fit'} ({how})"
    )
    if fits:
      winner = (candidate, moved, result)
      break
    # a move is kept when it lowers the peak by at least KEEP_GAIN; else the next move starts
    # from the layout before it (the winning flags then hold only the moves that helped)
    if peak is not None and (kept_peak is None or peak < kept_peak * (1 - KEEP_GAIN)):
      layout, kept_peak = changes, peak
  summary = {
      "memory_gib": memory_gib,
      "tries": tries,
      "compiles": searcher.compiled,
      "cached": searcher.cached,
  }
  if winner is None:
    measured = [t for t in tries if t["peak_gib"] is not None]
    closest = min(measured, key=lambda t: t["peak_gib"]) if measured else None
    report = {"fits": False, "fit": summary}
    if closest is None:
      raise NoFit("--fit: no layout compiled (each was refused by the config checks)", report)
    over = closest["peak_gib"] - memory_gib
    report.update(closest=closest)
    raise NoFit(
        f"no layout --fit tried fits in {gib(memory_gib)} per device: the closest, "
        f"{closest['flags'] or 'the config as given'}, needs {gib(closest['peak_gib'])} "
        f"({gib(over)} over): shard more (a larger --config.mesh.fsdp, --config.mesh.tensor "
        "or --config.mesh.context), lower --config.batch_size, or give a layout knob a value "
        "by hand",
        report,
    )
  candidate, moved, result = winner
  summary["flags"] = flags_text(moved)
  # `fits` against the memory searched for (a CPU's report has no chip to say it)
  result = {**result, "fits": True, "headroom_fits_by_gib": memory_gib - peak_gib(result)}
  ratio = flops_per_model_flop(searcher, candidate)
  summary["compiles"], summary["cached"] = searcher.compiled, searcher.cached
  return {**result, "flops_per_model_flop": ratio, "fit": summary}
