"""What both training drivers (the solo loop and the population) share around their step: when
to log, evaluate and save, the console progress, and stopping on a non-finite loss."""

from __future__ import annotations

import math
import sys

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


class Progress:
  """A tqdm bar on a terminal; plain log lines otherwise."""

  def __init__(self, start, total, enabled=True):
    self.enabled = enabled
    self.bar = None
    if enabled and sys.stderr.isatty():
      from tqdm import tqdm

      self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
    self.last = start

  def update(self, step, v):
    if not self.enabled:
      return
    text = f"loss {v['loss']:.4f} acc {v['accuracy']:.3f} {v['tokens_per_s']:,.0f} tok/s"
    if v.get("mfu") is not None:
      text += f" mfu {v['mfu']:.1%}"
    if self.bar is not None:
      self.bar.update(step - self.last)
      self.bar.set_postfix_str(text)
    else:
      print(f"step {step}: {text}", flush=True)
    self.last = step

  def note(self, step, ev):
    if not self.enabled:
      return
    text = f"step {step}: eval loss {ev['eval_loss']:.4f} acc {ev['eval_accuracy']:.3f}"
    if "eval_perplexity" in ev:
      text += f" ppl {ev['eval_perplexity']:.2f}"
    (self.bar.write if self.bar is not None else print)(text)

  def close(self):
    if self.bar is not None:
      self.bar.close()


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
