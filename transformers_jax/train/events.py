"""What both training drivers (the solo loop and the population) share around their step: when
to log, evaluate and save, the console progress, stopping on a non-finite loss, and a
`jax.profiler` trace of chosen steps (StepProfiler), in WORKDIR/tb where TensorBoard's profile
plugin and xprof look (plugins/profile/<run>/<host>.xplane.pb), on every process:

    --config.profile.start_step=100 --config.profile.num_steps=5
"""

from __future__ import annotations

import contextlib
import math
import pathlib
import sys
import time

import jax
import numpy as np

from transformers_jax.errors import Interrupted, UserError


class TrainingDiverged(UserError):
  """The loss or the gradient became non-finite at `step` (with that `loss`)."""

  def __init__(self, message: str, step: int, loss: float):
    super().__init__(message)
    self.step, self.loss = step, loss


def _finite(metrics) -> bool:
  return math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])


def step_events(config, done: int, end: int, stop_now: bool) -> tuple[bool, bool, bool]:
  """(log, evaluate, save) after step `done` of an invocation ending at `end`: each at its
  interval and all three at the end; a stop request (a signal) saves."""
  last = done == end
  log = done % config.log_every == 0 or last
  evaluate = bool(config.eval_every and done % config.eval_every == 0) or last
  save = bool(config.checkpoint_every and done % config.checkpoint_every == 0) or last or stop_now
  return log, evaluate, save


def stop_if_not_finite(pending, checkpoints, last_saved, values=None):
  """Raise TrainingDiverged when the metrics of `pending` = (step, metrics, rows) are not
  finite, saying why: non-finite inputs, or most likely the learning rate."""
  step, metrics, rows = pending
  values = values or {k: float(v) for k, v in jax.device_get(metrics).items()}
  if not _finite(values):
    checkpoints.wait()
    where = (
        f"the last good checkpoint is step {last_saved} in {checkpoints.directory}"
        if last_saved
        else "no checkpoint was written"
    )
    bad_inputs = [
        k
        for k, v in rows.items()
        if np.issubdtype(np.asarray(v).dtype, np.floating) and not np.all(np.isfinite(v))
    ]
    if bad_inputs:
      cause = (
          f"the batch of step {step} holds non-finite values in {', '.join(bad_inputs)}: "
          "check the data (--config.data.path) for NaN or infinite values"
      )
    else:
      cause = (
          "the inputs were finite, so most likely the learning rate is too high for this "
          "model: lower --config.learning_rate or raise warmup_steps (a state restored with "
          "non-finite values would also do it, but restores are checked)"
      )
    raise TrainingDiverged(
        f"loss became {values['loss']} (grad norm {values['grad_norm']}) at "
        f"step {step}: {where}; {cause}",
        step,
        values["loss"],
    )


def duration(seconds: float) -> str:
  """Seconds as h:mm:ss (m:ss under an hour)."""
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Pace:
  """Training speed for the console: steps per second over the steps timed since the last
  report, and the time left to `end` at that speed. The clock starts when the first step of
  the invocation is done (its time is mostly compilation) and skips evaluations."""

  def __init__(self, start: int, end: int, total: int):
    self.start, self.end, self.total = start, end, total
    self.began = self.clock = time.perf_counter()
    self.since = None  # the step the clock last started at; None until the first step is done
    self.first_step_s = None

  def first_step_done(self, done: int) -> None:
    self.first_step_s = time.perf_counter() - self.began
    self.clock, self.since = time.perf_counter(), done

  def leave_out(self, since: float) -> None:
    """Leave the time from `since` (a time.perf_counter() reading) to now out of the rate: work
    that is not training, such as an evaluation."""
    self.clock += time.perf_counter() - since

  def lap(self, done: int) -> float | None:
    """Steps per second since the last lap (None when no step was timed yet)."""
    now = time.perf_counter()
    timed = done - self.since if self.since is not None else 0
    rate = timed / max(now - self.clock, 1e-9) if timed > 0 else None
    if timed > 0:
      self.clock, self.since = now, done
    return rate

  def describe(self, done: int, steps_per_s: float | None) -> str:
    """E.g. "4.62 steps/s, ETA 0:38", or the first step's time, which includes compiling."""
    if steps_per_s is None and self.first_step_s is None:
      return "rate from the next line"
    if steps_per_s is None:
      return f"first step {self.first_step_s:.1f} s with compilation; rate from the next line"
    text = f"{steps_per_s:.3g} steps/s"
    if done < self.end:
      text += f", ETA {duration((self.end - done) / steps_per_s)}"
      if self.end < self.total:  # stop_after ends this invocation early
        text += f" to step {self.end}"
    return text


def router_text(values: dict, prefix: str = "") -> str:
  """A MoE model's router health in a few words: load-balancing loss, router z-loss (when
  weighted), the share of routing choices dropped, and the busiest expert's share."""
  if prefix + "moe_dropped_fraction" not in values:
    return ""
  parts = []
  if prefix + "moe_aux_loss" in values:
    parts.append(f"aux {values[prefix + 'moe_aux_loss']:.3f}")
  if values.get(prefix + "moe_router_z_loss"):
    parts.append(f"z {values[prefix + 'moe_router_z_loss']:.2f}")
  parts.append(f"dropped {values[prefix + 'moe_dropped_fraction']:.1%}")
  shares = [v for k, v in values.items() if k.startswith(prefix + "moe_expert_fraction_")]
  if shares:
    parts.append(f"busiest expert {max(shares):.1%} (even {1 / len(shares):.1%})")
  return "router " + ", ".join(parts)


class Progress:
  """A tqdm bar on a terminal; plain log lines otherwise: `step 325/500: loss ... | tokens/s,
  MFU, steps/s, ETA`."""

  def __init__(self, start, total, enabled=True):
    self.enabled, self.total = enabled, total
    self.bar = None
    if enabled and sys.stderr.isatty():
      from tqdm import tqdm

      self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
    self.last = start

  def update(self, step, v, pace_text=""):
    if not self.enabled:
      return
    text = f"loss {v['loss']:.4f} acc {v['accuracy']:.3f}"
    router = router_text(v)
    if router:
      text += f"; {router}"
    speed = [f"{v['tokens_per_s']:,.0f} tok/s"] if v.get("tokens_per_s") is not None else []
    if v.get("mfu") is not None:
      speed.append(f"mfu {v['mfu']:.1%}")
    if self.bar is not None:  # the bar shows the rate and the time left itself
      self.bar.update(step - self.last)
      self.bar.set_postfix_str(", ".join([text, *speed]))
    else:
      print(f"step {step}/{self.total}: {text} | {', '.join([*speed, pace_text])}", flush=True)
    self.last = step

  def note(self, step, ev):
    if not self.enabled:
      return
    text = f"step {step}/{self.total}: eval "
    if "eval_exact_match" in ev:  # what decoding gets right, before teacher-forced figures
      text += f"greedy exact match {ev['eval_exact_match']:.3f} BLEU {ev['eval_bleu']:.1f}; "
      text += "teacher-forced "
    text += f"loss {ev['eval_loss']:.4f} acc {ev['eval_accuracy']:.3f}"
    if "eval_perplexity" in ev:
      text += f" ppl {ev['eval_perplexity']:.2f}"
    if "eval_moe_dropped_fraction" in ev:
      text += f"; router dropped {ev['eval_moe_dropped_fraction']:.1%}"
    sources = [(k.split("/", 1)[1], v) for k, v in ev.items() if k.startswith("eval_loss/")]
    if sources:  # a mixture: each source's held-out loss
      text += "; by source " + ", ".join(f"{name} {v:.4f}" for name, v in sources)
    (self.bar.write if self.bar is not None else print)(text)

  def say(self, text: str) -> None:
    """A line of its own (above the bar on a terminal)."""
    if self.enabled and self.bar is not None:
      self.bar.write(text)
    elif self.enabled:
      print(text, flush=True)

  def close(self):
    if self.bar is not None:
      self.bar.close()


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


def run_steps(
    config,
    state,
    start: int,
    end: int,
    *,
    train_step,
    next_batch,
    checkpoints,
    stop_requests,
    profiler,
    on_step,
    cleanup=(),
):
  """The step loop both drivers share: steps start..end-1 of `train_step` on `next_batch(step)`
  = (device batch, host rows), under the profiler; after each, `on_step(done, state, metrics,
  rows, log, evaluate, save)` (the driver's checks, logging and evaluation), then the save and,
  on a stop request, the interruption (saved, one error line). `cleanup` callables run at the
  end, as do the signal handlers' and profiler's. Returns the last state."""
  try:
    for step in range(start, end):
      batch, rows = next_batch(step)
      with profiler.step(step, wait_for=state):
        state, metrics = train_step(state, batch)
      if step == start:  # compiled and started: from here a signal saves at a step boundary
        stop_requests.started()
      done = step + 1
      stop_now = stop_requests.stop_at(done)
      log_now, eval_now, save_now = step_events(config, done, end, stop_now)
      on_step(done, state, metrics, rows, log_now, eval_now, save_now)
      if save_now:
        checkpoints.save(done, state)
      if stop_now:
        profiler.stop(state)
        checkpoints.close()
        raise Interrupted(
            f"interrupted ({stop_requests.signal_name or 'signal'}): saved step {done} in "
            f"{checkpoints.directory}; run the same command again to resume"
        )
  finally:
    for close in cleanup:
      close()
    stop_requests.restore()
    profiler.stop()
  return state
