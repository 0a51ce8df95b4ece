"""Stopping a run cleanly: Ctrl-C (SIGINT) and SIGTERM (what SLURM, Kubernetes and spot VMs send
before they take the machine) both ask the loop to save a checkpoint at a step boundary and exit.

With several processes every one of them must save the same step, even when only one got the
signal. JAX's preemption service (started by `jax.distributed.initialize`) catches SIGTERM,
tells every process, and names one step at which they all stop; Ctrl-C on any process is handed
to it as a SIGTERM. With one process a flag set by the signal handler is enough.

Before the first step there is nothing to save, and building the data or compiling the step can
take minutes: with `abort_before_start`, a signal until `started()` ends the run at once with
one error line. The signal's handler raises where the main thread is; should the main thread be
held in a long call that does not return to Python (a compilation), a watchdog thread woken by
the signal itself ends the process after `ABORT_GRACE_S` seconds.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import jax

ABORT_GRACE_S = 3.0  # seconds the main thread has to unwind before the watchdog ends the process


class StopRequests:
  """Signal handlers for the duration of a run; `stop_at(step)` at every step boundary says
  whether to save and exit there (the same answer on every process)."""

  def __init__(self, abort_before_start: bool = False):
    self.requested = False  # a signal reached this process
    self.signal_name = ""
    self._after_run = False  # a StopRequests inside this one ran the steps, which are saved
    self._started = False
    self._wakeup = None  # (read end, write end, the wakeup fd before) of the watchdog's pipe
    self._sync = None
    if jax.process_count() > 1:
      from jax._src import distributed

      self._sync = distributed.global_state.preemption_sync_manager
    # until started(): a signal ends the run at once (one process: with several, the others
    # would wait for it in their first collective)
    self._abort = abort_before_start and self._sync is None
    self._previous = {signal.SIGINT: signal.signal(signal.SIGINT, self._handle)}
    if self._sync is None:  # else JAX's preemption notifier owns SIGTERM
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
    # a StopRequests set up around this one (the run's setup phase) whose signal was swallowed
    # (its raise caught by code that catches everything): the request carries over
    self._outer = next(
        (
            h.__self__
            for h in self._previous.values()
            if isinstance(getattr(h, "__self__", None), StopRequests)
        ),
        None,
    )
    outer = self._outer if self._outer is not None and self._outer.requested else None
    if outer is not None:
      self.requested, self.signal_name = True, outer.signal_name
      if self._abort:  # still before the first step: end the run now
        self.restore()
        from transformers_jax.errors import AbortedBeforeStart

        raise AbortedBeforeStart(self.abort_message(signal.Signals[outer.signal_name]))
    if self._abort:
      self._start_watchdog()

  def abort_message(self, signum: int) -> str:
    return (
        f"interrupted ({signal.Signals(signum).name}) before the first step, while the data "
        "was prepared or the step compiled: nothing was trained or saved; run the same command "
        "again to start"
    )

  def _start_watchdog(self):
    """A daemon thread the signal wakes (signal.set_wakeup_fd writes the signal number to a
    pipe from C, whatever the main thread is doing): before the first step it ends the
    process if the main thread has not done so within ABORT_GRACE_S."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
      before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: the handler alone
      os.close(read)
      os.close(write)
      return
    self._wakeup = (read, write, before)

    def watch():
      try:
        while data := os.read(read, 16):  # b"" once restore() closed the write end
          for signum in data:
            # only a signal this object handles (not one of a StopRequests set up inside)
            if self._abort and signal.getsignal(signum) == self._handle:
              threading.Event().wait(ABORT_GRACE_S)
              # the main thread has not got back to restore(), nor handed the signals to a
              # StopRequests of its own (which takes the request over)
              if self._abort and signal.getsignal(signum) == self._handle:
                print(f"error: {self.abort_message(signum)}", file=sys.stderr, flush=True)
                os._exit(2)
      finally:
        os.close(read)

    threading.Thread(target=watch, name="stop-before-first-step", daemon=True).start()

  def started(self):
    """The first step has run: from here a signal asks for a save at a step boundary."""
    self._abort = False
    self._started = True

  def _handle(self, signum, _frame):
    if self._after_run:  # the steps ran and were saved; the run is ending (sample, report)
      from transformers_jax.errors import InterruptedAfterRun

      raise InterruptedAfterRun(
          f"interrupted ({signal.Signals(signum).name}) after the last step, while the run "
          "ended: its checkpoints are saved; run the same command again to finish"
      )
    if self._abort:
      from transformers_jax.errors import AbortedBeforeStart

      # also a request: code that catches every exception (JAX's compilation-cache reads do)
      # would otherwise swallow the signal, and the run would go on as if never asked to stop
      self.requested, self.signal_name = True, signal.Signals(signum).name
      raise AbortedBeforeStart(self.abort_message(signum))
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
    self._previous = {}
    if self._started and self._outer is not None:  # the setup phase's handlers are back
      self._outer._abort, self._outer._after_run = False, True
    if self._wakeup is not None:
      _, write, before = self._wakeup
      self._wakeup = None
      self._abort = False
      signal.set_wakeup_fd(before)
      os.close(write)  # the watchdog's read returns b"" and it ends
