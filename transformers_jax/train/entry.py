"""train(), the one entry to training: it locks the run folder, builds the Setup and hands it
to the driver the config asks for, the solo loop (loop.py) or, for a config with population
settings, the population (population.py: the same step vmapped over its members)."""

from __future__ import annotations

import jax

from transformers_jax.errors import UserError
from transformers_jax.evaluate.harness import require_lm_eval
from transformers_jax.machine import parallel
from transformers_jax.run_folder.runs import Run
from transformers_jax.run_folder.workdir_lock import WorkdirBusy, WorkdirLock
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
