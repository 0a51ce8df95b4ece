"""Several processes on this machine joined as one JAX cluster (one of them the coordinator),
the way a pod or a multi-host GPU job runs: for checking multi-process behaviour (equal losses,
MFU over every process's devices) without a cluster."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Sequence


def free_port() -> int:
  """A TCP port on localhost that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def start_processes(
    command: Callable[..., Sequence[str]],
    num_processes: int,
    env: dict | None = None,
    cwd=None,
) -> list[subprocess.Popen]:
  """Start `num_processes` copies of a training command line, `command(*cluster_flags)`, each
  given --coordinator_address (a free local port), --num_processes and its --process_id; their
  stdout and stderr are pipes (read them with `communicate()`)."""
  address = f"localhost:{free_port()}"
  return [
      subprocess.Popen(
          list(
              command(
                  f"--coordinator_address={address}",
                  f"--num_processes={num_processes}",
                  f"--process_id={i}",
              )
          ),
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          cwd=cwd,
          env=env,
      )
      for i in range(num_processes)
  ]
