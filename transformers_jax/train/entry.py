"""train(), the one entry to training: it locks the run folder, builds the Setup and hands it
to the driver the config asks for, the solo loop (loop.py) or, for a config with population
settings, the population (population.py: the same step vmapped over its members).

One run per folder: WORKDIR/.lock (WorkdirLock) holds the host and pid of the run using it."""

from __future__ import annotations

import json
import os
import pathlib

import jax

from transformers_jax.errors import RunError, UserError
from transformers_jax.evaluate.harness import require_lm_eval
from transformers_jax.machine import parallel
from transformers_jax.run_folder.runs import Run
from transformers_jax.train import loop, population, trackers
from transformers_jax.train.preemption import StopRequests
from transformers_jax.train.setup import Setup


def train(config, workdir: str, task=None, allow_data_change: bool = False) -> dict:
  """Train (or resume) the run in `workdir`; returns the final metrics. The objective is the
  model's (tasks.task_for) unless a Task is given. A config with `population` settings trains
  its members as one program (train/population.py). One run per workdir: a second one stops
  with an error naming the first."""
  # before the workdir is locked: one line when a wandb.* field is one W&B refuses or is set
  # without wandb.project, or when wandb or lm-eval is asked for but missing
  trackers.check(config)
  trackers.check_unread(config)
  if config.get("eval_harness", {}).get("every"):
    require_lm_eval()
  run = Run(workdir)
  is_main = jax.process_index() == 0
  lock = WorkdirLock(run.path)
  problem = None
  if is_main:
    try:
      lock_note = lock.acquire()
      if lock_note:
        print(lock_note, flush=True)
    except (WorkdirBusy, OSError) as e:  # busy; or a workdir that cannot be made
      problem = e
  if not parallel.agree(problem is None):
    raise problem or UserError(f"process 0 could not lock {run.path}: see its error")
  # until the first step, Ctrl-C or SIGTERM ends the run at once: nothing is lost
  stop_requests = StopRequests(abort_before_start=True)
  try:
    setup = Setup(config, task)
    driver = population.train_population if setup.members else loop.train_solo
    return driver(setup, run, allow_data_change)
  finally:
    stop_requests.restore()
    lock.release()


class WorkdirBusy(RunError):
  """Another live run holds the folder's lock."""


class WorkdirLock:
  """WORKDIR/.lock: {host, pid, started} of the run using the folder, created exclusively. A
  lock whose process is gone (same host, no such pid) is taken over; one held by a live process,
  or by another host (whose processes cannot be checked from here), stops the second run."""

  def __init__(self, workdir):
    self.path = pathlib.Path(workdir) / ".lock"
    self.held = False

  def acquire(self) -> str | None:
    """Take the lock; returns a note when a dead run's lock was taken over, else None."""
    import datetime
    import socket

    host = socket.gethostname()
    note = None
    self.path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = self._holder()
        if holder is None:  # being written this instant, or not ours to read: look again
          import time

          time.sleep(0.2)
          holder = self._holder() or {}
        if holder.get("host") == host and not _pid_alive(holder.get("pid")):
          self.path.unlink(missing_ok=True)
          note = (
              f"note: took over the lock of a run that is gone (host {host}, pid "
              f"{holder.get('pid')})"
          )
          continue
        raise WorkdirBusy(
            f"{self.path.parent} is in use by another run (host {holder.get('host', '?')}, pid "
            f"{holder.get('pid', '?')}, since {holder.get('started', '?')}): wait for it or "
            f"stop it, or use another --workdir; if that run is gone, delete {self.path}"
        ) from None
      started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
      with os.fdopen(fd, "w") as f:
        json.dump({"host": host, "pid": os.getpid(), "started": started}, f)
      self.held = True
      return note
    raise WorkdirBusy(f"could not take {self.path}: another run keeps taking it")

  def _holder(self) -> dict | None:
    try:
      holder = json.loads(self.path.read_text())
      return holder if isinstance(holder, dict) and "pid" in holder else None
    except (OSError, ValueError):
      return None

  def release(self) -> None:
    if self.held:
      holder = self._holder() or {}
      if holder.get("pid") == os.getpid():
        self.path.unlink(missing_ok=True)
      self.held = False


def _pid_alive(pid) -> bool:
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's live process
    return True
  return True
