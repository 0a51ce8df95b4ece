"""Ahead-of-time check: compile the train step for the configured mesh without running it, and
report what XLA says it needs per device (memory) and costs (FLOPs) — before a run, not after."""

from __future__ import annotations

import json
import math
import re
import time

import jax
import numpy as np

from transformers_jax.machine import hardware
from transformers_jax.models import counting, flops
from transformers_jax.modules import parametrization, pipeline, quantization
from transformers_jax.train import field_checks
from transformers_jax.config import ModelConfig
from transformers_jax.tasks import task_for
from transformers_jax.train.setup import Setup

GIB = hardware.GIB


def devices_for(config) -> list:
  """The devices the mesh spans: a TPU topology's (compiled for, never run) when
  `mesh.topology` names one, else this host's."""
  topology = config.mesh.get("topology", "")
  if not topology:
    return jax.devices()
  return hardware.topology_devices(topology, int(config.mesh.get("num_slices", 1) or 1))


def build_step(config, devices=None, task=None) -> Setup:
  """The run's Setup from the config alone (its train_step(), abstract_state(),
  abstract_batch(), model config, mesh and task; a population's when the config asks for one);
  the task defaults to the model's (tasks.task_for). Nothing is allocated."""
  return Setup(config, task, devices)


def lower_train_step(config, devices=None, task=None):
  """(lowered step, its arguments as sharded ShapeDtypeStructs, model config, mesh), from
  shapes alone: no parameter is allocated. A population's step is the members' vmapped one."""
  setup = build_step(config, devices, task)
  args = (setup.abstract_state(), setup.abstract_batch())
  return setup.train_step().lower(*args), args, setup.model_cfg, setup.mesh


def compile_train_step(config, devices=None, task=None):
  """(compiled step, model config, mesh) from shapes alone: no parameter is allocated."""
  lowered, _, model_cfg, mesh = lower_train_step(config, devices, task)
  return lowered.compile(), model_cfg, mesh


class OutOfMemory(Exception):
  """The compiler refused the step for memory; `report` holds what is known."""

  def __init__(self, report: dict):
    super().__init__(report.get("compiler_message", "out of memory"))
    self.report = report


# How XLA's TPU compiler states a refusal; sizes like "24.88G" (binary units).
_REFUSALS = (
    (
        re.compile(
            r"HLO temporaries \(([0-9.]+)([KMGTP]?)\) exceeds available HBM "
            r"\(([0-9.]+)([KMGTP]?)\)"
        ),
        "temp",
    ),
    (re.compile(r"Used ([0-9.]+)([KMGTP]?) of ([0-9.]+)([KMGTP]?) hbm"), "total"),
)


def _bytes(number: str, unit: str) -> float:
  return float(number) * 1024 ** " KMGTP".index(unit or " ")


def _refusal(error: Exception, argument_bytes: float) -> dict | None:
  """What the compiler said when it refused a step for memory (None for other errors): its
  message, and the per-device peak it implies (its temporaries plus the step's arguments)."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
    return None
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  out = {
      "compiler_message": next(
          (line for line in lines if "memory" in line.lower()),
          lines[0] if lines else "out of memory",
      )[:400]
  }
  for pattern, kind in _REFUSALS:
    found = pattern.search(text)
    if found:
      used = _bytes(*found.group(1, 2))
      out["compiler_capacity_gib"] = _bytes(*found.group(3, 4)) / GIB
      if kind == "temp":
        out["per_device_temp_gib"] = used / GIB
        used += argument_bytes
      out["per_device_peak_estimate_gib"] = used / GIB
      break
  return out


def _argument_bytes(args) -> float:
  """Per-device bytes of the step's inputs (the sharded train state and batch)."""
  total = 0.0
  for arg in jax.tree_util.tree_leaves(args):
    total += float(np.prod(arg.sharding.shard_shape(arg.shape))) * np.dtype(arg.dtype).itemsize
  return total


def _cost_analysis(compiled) -> dict:
  """XLA's cost analysis of a compiled program, as one dict (some versions give a list of one)."""
  cost = compiled.cost_analysis()
  return (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}


def xla_flops(compiled, text: str) -> dict:
  """XLA's FLOP count of the compiled step, where it is one: its cost analysis counts the body
  of a loop once, whatever the trip count (a scanned stack of L layers reads as one layer, and
  so do gradient-accumulation and blockwise-attention loops). For a step without loops that is
  the whole step (`xla_flops_per_device_per_step`); for one with loops the figure is left out
  and `xla_flops_omitted` says why: multiplying by trip counts would be this project's count,
  not the compiler's. `text`: the compiled program's HLO (compiled.as_text(), read once by the
  report)."""
  loops = len(_WHILE.findall(text))
  if loops:
    return {
        "xla_flops_omitted": (
            f"the compiled step has {loops} loop(s) (scanned layers, gradient accumulation or "
            "blockwise attention) whose bodies XLA's cost analysis counts once: see "
            "model_flops_per_device_per_step"
        )
    }
  cost = _cost_analysis(compiled)
  return {"xla_flops_per_device_per_step": float(cost.get("flops", 0.0))} if cost else {}


# A transfer between slices in a multi-slice TPU program: a host-transfer send whose attributes
# name the DCN collective it is part of (`_xla_megascale_transfer_type`, e.g. ALL_REDUCE).
_DCN_SEND = re.compile(
    r"= \(?(\w+)\[([\d,]*)\][^=]*? send\(.*?_xla_host_transfer_rendezvous=\"([^\"]+)\".*?"
    r"_xla_megascale_transfer_type=\"(\w+)\""
)
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f64": 8, "s8": 1, "u8": 1, "pred": 1}


def dcn_collectives(text: str) -> dict:
  """{kind: {"count", "mib_in_text"}} of the collectives that cross slices (the data-center
  network) in a compiled multi-slice TPU step's HLO `text`: XLA runs them as host transfers tagged with their
  kind (ALL_REDUCE, ALL_GATHER, ...). `count` is the distinct collectives in the program text
  and `mib_in_text` the bytes per chip they send, a loop's body (a scanned stack's layer)
  counted once, as in XLA's cost analysis: what crosses, not how much per step."""
  seen, out = set(), {}
  for dtype, dims, rendezvous, kind in _DCN_SEND.findall(text):
    size = _BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    entry = out.setdefault(kind, {"count": 0, "mib_in_text": 0.0})
    if rendezvous not in seen:
      seen.add(rendezvous)
      entry["count"] += 1
    entry["mib_in_text"] += size / 2**20
  return out


# An instruction of XLA's HLO text: `%name = type[dims]{layout} opcode(operands...), ...`
# (`ROOT ` before the name where it ends its computation).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[[^=]*?\s([\w\-]+)\((.*?)\)")
_OPERAND = re.compile(r"%([\w.\-]+)")
_EIGHT_BIT = ("s8", "u8", "f8e")  # int8, uint8 and every float8 (f8e4m3fn, f8e5m2, ...)


def dot_counts(text: str) -> dict:
  """The matrix products in a compiled program's HLO `text`: `dots`, the dot instructions (and
  convolutions, into which the TPU compiler turns some dots), and `quantized_dots`, those whose
  operands are all 8-bit (int8 or float8: the products an int8/fp8 matrix unit runs). Counted
  in the program's text, so a loop's body (a scanned stack's layer) counts once, as XLA's cost
  analysis counts it: which products are quantized, not how many run per step."""
  dtypes, products = {}, []
  for line in text.splitlines():
    found = _INSTRUCTION.match(line)
    if found:
      name, dtype, opcode, operands = found.groups()
      dtypes[name] = dtype
      if opcode in ("dot", "convolution"):
        products.append(_OPERAND.findall(operands)[:2])
  quantized = sum(
      all(dtypes.get(n, "").startswith(_EIGHT_BIT) for n in names) for names in products
  )
  return {"dots": len(products), "quantized_dots": quantized}


def bytes_accessed(compiled) -> dict:
  """XLA's bytes accessed per device by the compiled step (its cost analysis, which counts a
  loop's body once, as for `xla_flops`)."""
  moved = float(_cost_analysis(compiled).get("bytes accessed", 0.0))
  return {"xla_bytes_accessed_per_device_gib": moved / GIB} if moved else {}


# A while loop in XLA's HLO text: `name = (types) while(operands), condition=..., body=...`.
_WHILE = re.compile(r"\bwhile\(")


def report(config, devices=None, verbose: bool = True, task=None) -> dict:
  """Compile the train step (for `mesh.topology` when set) and describe it as one dict: XLA's
  per-device memory (the parts, this project's peak estimate from them and XLA's own peak),
  XLA's FLOPs where its count covers the whole step (see `xla_flops`), the model's FLOPs, and
  for known chips whether it fits (`fits`: XLA's own peak within the chip's HBM, or the
  estimate where the backend reports no peak).
  Raises OutOfMemory (carrying the same dict, `fits: false`) when the compiler refuses; a
  compiled step with `fits: false` is returned, and the command line exits 3 for both."""
  topology = config.mesh.get("topology", "")
  devices = devices_for(config) if devices is None else devices
  kind = devices[0].device_kind
  chip = hardware.chip_for_topology(topology) if topology else hardware.chip_for_kind(kind)
  model_cfg = ModelConfig.from_dict(config.model)
  field_checks.check_attention_platform(model_cfg, devices)  # (before counting traces it)
  quantization.platform_check(model_cfg, devices)
  task = task or task_for(model_cfg, config)
  per_example = task.tokens_per_example(model_cfg, config)
  tokens = config.batch_size * per_example
  out = {
      "topology": topology or None,
      "chips": hardware.chips_of(devices),
      "devices": len(devices),
      "device_kind": kind,
      "params": counting.count(model_cfg),
      "parametrization": parametrization.describe(model_cfg),
      "batch_size": config.batch_size,
      "tokens_per_step": tokens,
      "hbm_gib": chip.hbm_gib if chip else None,
  }
  start = time.perf_counter()
  setup = build_step(config, devices, task)  # validates the config against the mesh
  args = (setup.abstract_state(), setup.abstract_batch())
  if model_cfg.lora_rank:  # only the adapters train: they alone have optimizer state
    out["trainable_params"] = counting.lora_count(model_cfg)
  # the train state's parts per device, as sharded: parameters and optimizer state
  out["per_device_params_gib"] = _argument_bytes(args[0].params) / GIB
  out["per_device_optimizer_state_gib"] = _argument_bytes(args[0].opt_state) / GIB
  lowered, mesh = setup.train_step().lower(*args), setup.mesh
  out["mesh"] = dict(mesh.shape)
  if setup.members:  # the population's step: every member's state and batch, per device
    out["population_members"] = setup.member_count
    out["tokens_per_step"] = tokens * setup.member_count
  try:
    compiled = lowered.compile()
  except Exception as e:  # noqa: BLE001 - only the compiler's memory refusal is ours to report
    refusal = _refusal(e, _argument_bytes(args))
    if refusal is None:
      raise
    out.update(refusal, fits=False, compile_s=round(time.perf_counter() - start, 2))
    if chip and "per_device_peak_estimate_gib" in out:  # the compiler's figure: the estimate
      out["headroom_gib"] = chip.hbm_gib - out["per_device_peak_estimate_gib"]
      out["headroom_fits_by_gib"] = out["headroom_gib"]
    if verbose:
      print(json.dumps(out, indent=1))
    raise OutOfMemory(out) from None
  out["compile_s"] = round(time.perf_counter() - start, 2)
  mem = compiled.memory_analysis()
  if mem is not None:
    out.update(
        {
            "per_device_argument_gib": mem.argument_size_in_bytes / GIB,
            "per_device_output_gib": mem.output_size_in_bytes / GIB,
            "per_device_temp_gib": mem.temp_size_in_bytes / GIB,
            "per_device_generated_code_gib": mem.generated_code_size_in_bytes / GIB,
            "per_device_alias_gib": mem.alias_size_in_bytes / GIB,
        }
    )
    host = getattr(mem, "host_argument_size_in_bytes", 0)
    if host:  # config.host_offload: the parts of the state kept in the host's pinned memory
      out["per_device_host_argument_gib"] = host / GIB
    out["per_device_peak_estimate_gib"] = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    ) / GIB
    # The compiler's own peak of live buffers (0 where a jaxlib or backend does not say). It
    # can exceed the sum above: on TPU it counts a few MiB the buffer sizes do not, and a
    # scanned step can report 0 temporaries while its loop body holds some; and it can be far
    # below it, since the sum takes every argument, output and temporary as live at once, which
    # buffer assignment knows they are not (MaxText's 32B recipe on v5p: 85.5 GiB XLA peak,
    # 94.3 estimated). `fits` is the compiler's figure within the chip's memory (the estimate
    # where the backend gives none: `fits_by` says which), `headroom_fits_by_gib` the margin
    # `fits` reads; `headroom_gib` is HBM minus the estimate, the margin should every buffer be
    # live at once. A step can fit with a negative `headroom_gib`: docs/scaling.md.
    xla_peak = getattr(mem, "peak_memory_in_bytes", 0)
    if xla_peak:
      out["per_device_peak_xla_gib"] = xla_peak / GIB
    if chip:
      out["fits_by"] = "xla_peak" if xla_peak else "estimate"
      figure = out.get("per_device_peak_xla_gib", out["per_device_peak_estimate_gib"])
      out["fits"] = figure <= chip.hbm_gib
      out["headroom_fits_by_gib"] = chip.hbm_gib - figure
      out["headroom_gib"] = chip.hbm_gib - out["per_device_peak_estimate_gib"]
  text = compiled.as_text()  # (megabytes for a large step: read once, for every count below)
  out.update(xla_flops(compiled, text))
  out.update(dot_counts(text))
  out.update(bytes_accessed(compiled))
  out["quantization"] = model_cfg.quantization or None
  stages = int(mesh.shape.get("stage", 1))
  if stages > 1:  # every chip runs one stage's share of the same program: its figures are a stage's
    out["pipeline"] = pipeline.schedule_report(setup.model_cfg, stages)
    out["pipeline"]["per_stage_params_gib"] = out["per_device_params_gib"] * len(devices) / stages
    out["pipeline"]["per_stage_chip_peak_gib"] = out.get(
        "per_device_peak_xla_gib", out.get("per_device_peak_estimate_gib")
    )
  if int(config.mesh.get("num_slices", 1) or 1) > 1:
    out["num_slices"] = int(config.mesh.num_slices)
    out["dcn_collectives"] = dcn_collectives(text)
  # every member's tokens for a population: its step does the arithmetic of all of them
  out["model_flops_per_step"] = (
      flops.flops_per_token(model_cfg, per_example) * out["tokens_per_step"]
  )
  out["model_flops_per_device_per_step"] = out["model_flops_per_step"] / len(devices)
  if chip:  # what 50% of the data-sheet peak would give: a yardstick, not a measurement
    out["step_s_at_50pct_mfu"] = out["model_flops_per_step"] / (
        0.5 * chip.bf16_flops * out["chips"]
    )
  if verbose:
    print(json.dumps(out, indent=1))
  return out
