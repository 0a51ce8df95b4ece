"""A full disk (or an exhausted quota) while a checkpoint is written: one line that names the
folder, what the save needs and what to free, instead of the errors orbax's background threads
and asyncio log on their way (each with a traceback: hundreds of lines for one cause).

Orbax writes a checkpoint under a temporary name and renames it on commit, so a save that runs
out of space leaves the checkpoints saved before it intact; its partial folder is removed here
(orbax would remove it at the next start), which gives back the space it took."""

from __future__ import annotations

import logging
import pathlib
import re
import shutil
import sys
import traceback

from transformers_jax.errors import UserError

# How the operating system's "no space" and "quota exceeded" read in Python's, tensorstore's
# and orbax's words (errno 28 is ENOSPC, 122 EDQUOT).
_FULL = re.compile(
    r"No space left on device|Disk quota exceeded|os_error_code='?(28|122)\b|\bENOSPC\b|\bEDQUOT\b"
)


def is_disk_full(error: BaseException | str) -> bool:
  if isinstance(error, OSError) and error.errno in (28, 122):
    return True
  return bool(_FULL.search(str(error)))


class _DropDiskFullRecords(logging.Filter):
  """Drops log records (orbax's, through absl; asyncio's "Task exception was never retrieved")
  that report a write failing for want of space: the save raises it, and the command says it
  once."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += " " + str(record.exc_info[1])
    if record.levelno >= logging.ERROR and is_disk_full(text):
      return False
    return True


_FILTER = _DropDiskFullRecords()


def quiet_disk_full_logs() -> None:
  """Install the filter on the loggers orbax and asyncio report through, and the hook below
  (once)."""
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
      logger.addFilter(_FILTER)
  if not getattr(sys.unraisablehook, "drops_closed_loop_callbacks", False):
    sys.unraisablehook = _without_closed_loop_callbacks(sys.unraisablehook)


def _closed_loop_callback(kind, value, tb) -> bool:
  return (
      kind is RuntimeError
      and str(value) == "Event loop is closed"
      and any(f.name == "call_soon_threadsafe" for f in traceback.extract_tb(tb))
  )


def _without_closed_loop_callbacks(hook):
  """sys.unraisablehook, less the RuntimeError('Event loop is closed') that tensorstore reports
  through it for each write or read still in flight when orbax abandoned a save or restore (its
  callback finds orbax's event loop closed): the error that abandoned it is what the user sees."""

  def unraisablehook(unraisable):
    if not _closed_loop_callback(
        unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback
    ):
      hook(unraisable)

  unraisablehook.drops_closed_loop_callbacks = True
  return unraisablehook


def _megabytes(n: int) -> str:
  return f"{n / 2**20:,.1f} MB"


def save_failed(directory: pathlib.Path, step: int | None, needed: int, saved: int | None):
  """The UserError for a checkpoint save at `step` into `directory` that ran out of space, after
  removing the save's partial folder. `needed`: the bytes of the saved tree; `saved`: the newest
  checkpoint committed before it (None: none)."""
  for partial in directory.glob("*.orbax-checkpoint-tmp*"):
    shutil.rmtree(partial, ignore_errors=True)
  try:
    free = shutil.disk_usage(directory).free
  except OSError:
    free = 0
  again = (
      f"the checkpoint of step {saved} is intact; then run the same command again to resume"
      if saved is not None
      else "nothing was saved yet; then run the same command again (it starts from step 0)"
  )
  return UserError(
      f"the disk holding {directory} is full: checkpoint step {step} needs about "
      f"{_megabytes(needed)} and {_megabytes(free)} are free: free at least "
      f"{_megabytes(max(needed - free, 1))} there (old runs, caches) or give a --workdir on a "
      f"larger disk; {again}"
  )
