"""Several processes on this machine joined as one JAX cluster (one of them the coordinator),
the way a pod or a multi-host GPU job runs: for checking multi-process behaviour (equal losses,
MFU over every process's devices, per-process batch rows) without a cluster."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Sequence


def free_port() -> int:
  """A TCP port on localhost that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def cluster_flags(process_id: int, address: str, num_processes: int) -> list[str]:
  """The training command line's flags that make it process `process_id` of a cluster."""
  return [
      f"--coordinator_address={address}",
      f"--num_processes={num_processes}",
      f"--process_id={process_id}",
  ]


def start_processes(
    command: Callable[[int, str], Sequence[str]],
    num_processes: int,
    env: dict | None = None,
    cwd=None,
    stderr=subprocess.PIPE,
) -> list[subprocess.Popen]:
  """Start `num_processes` processes, process i running `command(i, address)` with `address`
  the coordinator's (localhost and a free port; add `cluster_flags` for a training command).
  Their stdout is a pipe, stderr a pipe too unless given (subprocess.STDOUT: merged); read them
  with `communicate()`."""
  address = f"localhost:{free_port()}"
  return [
      subprocess.Popen(
          list(command(i, address)),
          stdout=subprocess.PIPE,
          stderr=stderr,
          text=True,
          cwd=cwd,
          env=env,
      )
      for i in range(num_processes)
  ]
