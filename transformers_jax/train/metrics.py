"""Metrics output (JSONL, TensorBoard) and model FLOPs utilisation against a device's peak."""

from __future__ import annotations

import functools
import json
import math
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


def device_peak() -> tuple[float | None, str]:
  """(peak FLOP/s of all local devices, where the figure comes from)."""
  devices = jax.local_devices()
  kind = devices[0].device_kind
  if devices[0].platform == "cpu":
    return measured_cpu_peak(), "measured float32 1024x1024 matmul on this CPU"
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

  def write(self, step: int, values: dict, tb_prefix: str = "") -> None:
    """One metrics.jsonl line; TensorBoard scalars named `tb_prefix` + key (a population
    member's values go under member_<i>/)."""
    if not self.enabled:
      return
    self.file.write(json.dumps({"step": step, **values}) + "\n")
    for key, value in values.items():
      if isinstance(value, (int, float)):
        if math.isfinite(value):  # a diverged member's NaN stays in metrics.jsonl only
          self.tb.add_scalar(tb_prefix + key, value, step)
      elif isinstance(value, dict):  # per layer, per stack (residual RMS, attention logits)
        for stack, layers in value.items():
          for i, v in enumerate(layers):
            if math.isfinite(v):
              self.tb.add_scalar(f"{tb_prefix}{key}/{stack}/layer_{i}", v, step)

  def close(self) -> None:
    if self.enabled:
      self.file.close()
      self.tb.close()
