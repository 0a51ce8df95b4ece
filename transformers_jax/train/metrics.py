"""Metrics output (JSONL, TensorBoard) and model FLOPs utilisation against a device's peak."""

from __future__ import annotations

import functools
import json
import pathlib
import time

import jax
import jax.numpy as jnp

from transformers_jax import hardware


@functools.cache
def measured_cpu_peak(n: int = 1024, repeats: int = 20) -> float:
  """FLOP/s of a large float32 matmul on this CPU (all its cores), best of `repeats` (a shared
  host's noise only ever slows a run down, so the best is the closest to the true peak)."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best


def device_peak(devices=None, per_device_override: float = 0.0) -> tuple[float | None, str]:
  """(peak FLOP/s of `devices`, where the figure comes from); default: every device of every
  process, since throughput is counted over the global batch. `per_device_override` (FLOP/s of
  one device, > 0) replaces the data sheet, e.g. for a chip the table does not know.

  On a CPU the figure is measured: this host's matmul rate shared among its local devices, times
  the devices of the whole run (every host is taken to be alike)."""
  devices = list(jax.devices() if devices is None else devices)
  if per_device_override:
    return (
        per_device_override * len(devices),
        f"given per-device peak {per_device_override:.3g} FLOP/s x {len(devices)}",
    )
  kind = devices[0].device_kind
  if devices[0].platform == "cpu":
    local = max(1, sum(d.process_index == jax.process_index() for d in devices))
    return (
        measured_cpu_peak() / local * len(devices),
        "measured float32 1024x1024 matmul on this CPU"
        + (f" x {len(devices) // local} hosts' devices" if len(devices) > local else ""),
    )
  chip = hardware.chip_for_kind(kind)
  if chip is None:
    return None, f"unknown peak for {kind!r}: MFU not reported"
  return (
      chip.bf16_flops * len(devices),
      f"{chip.name} bf16 dense data-sheet peak x {len(devices)}",
  )


class MetricsWriter:
  """WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard events in WORKDIR/tb."""

  def __init__(self, workdir, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    workdir = pathlib.Path(workdir)
    self.file = open(workdir / "metrics.jsonl", "a", buffering=1)
    from tensorboardX import SummaryWriter

    self.tb = SummaryWriter(str(workdir / "tb"))

  def write(self, step: int, values: dict) -> None:
    if not self.enabled:
      return
    self.file.write(json.dumps({"step": step, **values}) + "\n")
    for key, value in values.items():
      if isinstance(value, (int, float)):
        self.tb.add_scalar(key, value, step)
      elif isinstance(value, dict):  # residual RMS per layer, per stack
        for stack, layers in value.items():
          for i, v in enumerate(layers):
            self.tb.add_scalar(f"{key}/{stack}/layer_{i}", v, step)

  def close(self) -> None:
    if self.enabled:
      self.file.close()
      self.tb.close()
