"""One run per folder: WORKDIR/.lock holds the host and pid of the run using it."""

from __future__ import annotations

import json
import os
import pathlib

from transformers_jax.errors import RunError


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
