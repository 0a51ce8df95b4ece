"""Python's resource tracker (a process of its own) is told of every shared-memory block the data
workers create and the training process frees. If it dies (killed, out of memory), Python starts
a new one at the next message; that one never heard of the blocks created before, and prints a
`KeyError` traceback for each one freed afterwards (dozens a minute), while training goes on
unharmed. guard_tracker() keeps the training process from telling the new tracker about blocks
it never registered, which leaves Python's one warning about the relaunch."""

from __future__ import annotations

import threading

_LOCK = threading.RLock()


def guard_tracker() -> None:
  """Install the guard on this process's resource tracker (once)."""
  from multiprocessing import resource_tracker

  tracker = getattr(resource_tracker, "_resource_tracker", None)
  needed = ("ensure_running", "register", "unregister", "_pid")
  if tracker is None or not all(hasattr(tracker, n) for n in needed):
    return  # another Python's tracker: leave it as it is
  if getattr(tracker, "guarded_against_relaunch", False):
    return
  ensure_running, register, unregister = (
      tracker.ensure_running,
      tracker.register,
      tracker.unregister,
  )
  state = {"relaunched": False, "since": set()}

  def guarded_ensure_running():
    with _LOCK:
      before = tracker._pid
      ensure_running()
      if before is not None and tracker._pid != before:  # the old one died: a new one started
        state["relaunched"], state["since"] = True, set()

  def guarded_register(name, rtype):
    guarded_ensure_running()
    state["since"].add((name, rtype))
    register(name, rtype)

  def guarded_unregister(name, rtype):
    guarded_ensure_running()
    if state["relaunched"] and (name, rtype) not in state["since"]:
      return  # registered with the tracker that died: the new one would print a KeyError
    state["since"].discard((name, rtype))
    unregister(name, rtype)

  tracker.ensure_running = guarded_ensure_running
  tracker.register = guarded_register
  tracker.unregister = guarded_unregister
  tracker.guarded_against_relaunch = True
  # the module's functions are the tracker's bound methods, taken when it was made
  resource_tracker.ensure_running = guarded_ensure_running
  resource_tracker.register = guarded_register
  resource_tracker.unregister = guarded_unregister
