"""The project's error types, below everything that raises them, and the command lines' exit
codes: a UserError is printed as one `error:` line with exit code 2 (transformers_jax/cli.py).

Exit codes of every command line (`python -m transformers_jax.train` and the scripts):
  0   done
  2   a user's mistake, or a failure the one `error:` line explains (nothing lost)
  3   --compile_only: the step does not fit in device memory (with --fit: no layout tried does)
  75  stopped by a signal (SIGTERM, Ctrl-C) after saving a checkpoint: run the same command
      again to resume. A batch script requeues the job on it (scripts/cluster/train.sbatch).
      75 is EX_TEMPFAIL of BSD's sysexits.h: a temporary failure, to be retried.
  130 Ctrl-C where nothing could be saved (a second Ctrl-C)
"""

from __future__ import annotations

EXIT_USER_ERROR = 2
EXIT_SAVED_AND_STOPPED = 75


class UserError(Exception):
  """A mistake in what the user asked for: printed as one line, exit code 2."""


class Interrupted(UserError):
  """A signal stopped the run after it saved a checkpoint: printed as one line like any
  UserError, but with exit code EXIT_SAVED_AND_STOPPED (75), so that whatever launched the run
  can tell "saved, start me again" from a failure."""


class InterruptedAfterRun(Interrupted):
  """A signal after the steps, while the run ends (its sample, its report): everything is
  saved. Exit code 75 like Interrupted, and, like AbortedBeforeStart, no interpreter shutdown:
  the signal may have broken into a compilation."""


class AbortedBeforeStart(UserError):
  """A signal (Ctrl-C, SIGTERM) before the first step: nothing was trained or saved. Printed as
  one line with exit code 2, like any UserError, after which the process ends at once, without
  the interpreter's shutdown: the signal may have broken into a compilation, and XLA's cleanup
  of what that left half-built can crash the process at exit (a segmentation fault, exit code
  139, where a launcher expects 2)."""


class RunError(ValueError):
  """A run folder that cannot give what was asked (one line: the problem and the fix)."""


class CheckpointDamaged(RunError):
  """A run has no intact checkpoint (or not the one asked for). The message is `problem`, what
  is wrong, followed by `fix`, what to do about the run in training; `problem` alone serves a
  reader of another run's checkpoints (a distillation's teacher), whose fix is not this run's."""

  def __init__(self, problem: str, fix: str = ""):
    super().__init__(problem + fix)
    self.problem = problem
