"""Stopping a run cleanly: Ctrl-C (SIGINT) and SIGTERM (what SLURM, Kubernetes and spot VMs send
before they take the machine) both ask the loop to save a checkpoint at a step boundary and exit.

With several processes every one of them must save the same step, even when only one got the
signal. JAX's preemption service (started by `jax.distributed.initialize`) catches SIGTERM,
tells every process, and names one step at which they all stop; Ctrl-C on any process is handed
to it as a SIGTERM. With one process a flag set by the signal handler is enough.
"""

from __future__ import annotations

import os
import signal

import jax


class StopRequests:
  """Signal handlers for the duration of a run; `stop_at(step)` at every step boundary says
  whether to save and exit there (the same answer on every process)."""

  def __init__(self):
    self.requested = False  # a signal reached this process
    self.signal_name = ""
    self._sync = None
    if jax.process_count() > 1:
      from jax._src import distributed

      self._sync = distributed.global_state.preemption_sync_manager
    self._previous = {signal.SIGINT: signal.signal(signal.SIGINT, self._handle)}
    if self._sync is None:  # else JAX's preemption notifier owns SIGTERM
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, _frame):
    if self.requested and signum == signal.SIGINT:  # a second Ctrl-C aborts at once
      self.restore()
      raise KeyboardInterrupt
    self.requested = True
    self.signal_name = signal.Signals(signum).name
    if self._sync is not None:  # let every process agree on the step to stop at
      os.kill(os.getpid(), signal.SIGTERM)

  def stop_at(self, step: int) -> bool:
    """Whether to save and exit after `step` (call it at every step, on every process, with
    the same step numbers)."""
    if self._sync is not None:
      if self._sync.reached_sync_point(step):
        self.signal_name = self.signal_name or "SIGTERM"
        return True
      return False
    return self.requested

  def restore(self):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
