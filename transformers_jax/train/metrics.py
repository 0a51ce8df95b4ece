"""Metrics output (JSONL, TensorBoard) and model FLOPs utilisation against a device's peak."""

from __future__ import annotations

import functools
import json
import math
import pathlib
import time

import jax
import jax.numpy as jnp

from transformers_jax.machine import hardware


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


def device_peak(
    devices=None, per_device_override: float = 0.0, cpu_hosts: int | None = None
) -> tuple[float | None, str]:
  """(peak FLOP/s of `devices`, where the figure comes from); default: every device of every
  process, since throughput is counted over the global batch. `per_device_override` (FLOP/s of
  one device, > 0) replaces the data sheet, e.g. for a chip the table does not know.

  A CPU is measured: process 0's matmul rate (measured while the others wait, so that processes
  sharing a host do not halve each other's figure) times the number of distinct hosts of the run
  (`cpu_hosts`, found by asking every process when not given). Call it on every process."""
  devices = list(jax.devices() if devices is None else devices)
  if per_device_override:
    return (
        per_device_override * len(devices),
        f"given per-device peak {per_device_override:.3g} FLOP/s x {len(devices)}",
    )
  kind = devices[0].device_kind
  if devices[0].platform == "cpu":
    hosts, rate = (cpu_hosts, measured_cpu_peak()) if cpu_hosts else _cpu_hosts_and_rate()
    return (
        rate * hosts,
        "measured float32 1024x1024 matmul on this CPU"
        + (f" x {hosts} hosts" if hosts > 1 else ""),
    )
  chip = hardware.chip_for_kind(kind)
  if chip is None:
    return None, f"unknown peak for {kind!r}: MFU not reported"
  return (
      chip.bf16_flops * len(devices),
      f"{chip.name} bf16 dense data-sheet peak x {len(devices)}",
  )


def _cpu_hosts_and_rate() -> tuple[int, float]:
  """(distinct hosts among the run's processes, process 0's measured CPU FLOP/s)."""
  if jax.process_count() == 1:
    return 1, measured_cpu_peak()
  import socket
  import zlib

  import numpy as np
  from jax.experimental import multihost_utils

  names = multihost_utils.process_allgather(
      np.int32(zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF)
  )
  rate = measured_cpu_peak() if jax.process_index() == 0 else 0.0
  rate = float(multihost_utils.broadcast_one_to_all(np.float32(rate)))
  return len(set(np.asarray(names).ravel().tolist())), rate


def drop_torn_last_line(path: pathlib.Path) -> None:
  """Cut a last line without its newline from `path`: the part of a record a killed process
  was writing. Appending after it would glue the next record onto it, and both would be lost
  to any reader of the lines."""
  if not path.exists() or path.stat().st_size == 0:
    return
  with open(path, "rb+") as f:
    f.seek(-1, 2)
    if f.read(1) == b"\n":
      return
    f.seek(0)
    f.truncate(f.read().rfind(b"\n") + 1)


def scalars(values: dict, prefix: str = ""):
  """(name, number) of each number of a metrics line, named as TensorBoard and W&B show them:
  `prefix` + key; a dict's entries under key/entry and a list's under key/layer_<i> (the
  per-layer diagnostics: residual_rms/decoder/layer_0); None and text left out."""
  for key, value in values.items():
    yield from _flat(prefix + str(key), value)


def _flat(name: str, value):
  if isinstance(value, dict):
    for key, inner in value.items():
      yield from _flat(f"{name}/{key}", inner)
  elif isinstance(value, (list, tuple)):
    for i, inner in enumerate(value):
      yield from _flat(f"{name}/layer_{i}", inner)
  elif isinstance(value, (bool, int, float)):
    yield name, value


class TensorBoard:
  """TensorBoard scalars in `directory` (WORKDIR/tb): every finite number of a metrics line (a
  diverged member's NaN stays in metrics.jsonl only)."""

  def __init__(self, directory):
    from tensorboardX import SummaryWriter

    self.tb = SummaryWriter(str(directory))

  def write(self, step: int, values: dict, prefix: str = "") -> None:
    for name, value in scalars(values, prefix):
      if math.isfinite(value):
        self.tb.add_scalar(name, value, step)

  def close(self) -> None:
    self.tb.close()


class MetricsWriter:
  """WORKDIR/metrics.jsonl (one JSON object per line) and the same lines to each tracker: a
  TensorBoard in WORKDIR/tb, and those given (train/trackers.py: Weights & Biases). A tracker
  has write(step, values, prefix) and close(); `prefix` names a population member's values
  (member_<i>/)."""

  def __init__(self, workdir, enabled: bool = True, trackers=()):
    self.enabled = enabled
    if not enabled:
      return
    workdir = pathlib.Path(workdir)
    drop_torn_last_line(workdir / "metrics.jsonl")
    self.file = open(workdir / "metrics.jsonl", "a", buffering=1)
    self.trackers = [TensorBoard(workdir / "tb"), *trackers]

  def write(self, step: int, values: dict, tb_prefix: str = "") -> None:
    """One metrics.jsonl line; the trackers' values named `tb_prefix` + key (a population
    member's go under member_<i>/)."""
    if not self.enabled:
      return
    self.file.write(json.dumps({"step": step, **values}) + "\n")
    for tracker in self.trackers:
      tracker.write(step, values, tb_prefix)

  def close(self) -> None:
    if self.enabled:
      self.file.close()
      for tracker in self.trackers:
        tracker.close()
