"""A `jax.profiler` trace of chosen training steps, in WORKDIR/tb where TensorBoard's profile
plugin and xprof look (plugins/profile/<run>/<host>.xplane.pb), on every process.

    --config.profile.start_step=100 --config.profile.num_steps=5
"""

from __future__ import annotations

import contextlib
import pathlib

import jax


class StepProfiler:
  """Starts the trace before step `start_step`, stops it after `num_steps` steps; each step is
  marked with a StepTraceAnnotation so the tools split the trace by step."""

  def __init__(self, start_step: int, num_steps: int, logdir):
    self.start, self.num = int(start_step), int(num_steps)
    self.logdir = pathlib.Path(logdir)
    self.active = False

  @property
  def enabled(self) -> bool:
    return self.num > 0

  def step(self, step: int, wait_for=None):
    """A context around dispatching `step` (counted from 0); `wait_for` is what the previous
    traced step produced, finished before the trace stops."""
    if self.enabled and not self.active and self.start <= step < self.start + self.num:
      self.logdir.mkdir(parents=True, exist_ok=True)
      jax.profiler.start_trace(str(self.logdir))
      self.active = True
    if self.active and step >= self.start + self.num:
      self.stop(wait_for)
    if self.active:
      return jax.profiler.StepTraceAnnotation("train", step_num=step)
    return contextlib.nullcontext()

  def stop(self, wait_for=None):
    if self.active:
      if wait_for is not None:
        jax.block_until_ready(wait_for)
      jax.profiler.stop_trace()
      self.active = False
