"""Joining a multi-process JAX cluster: where the coordinator is (given with
--coordinator_address, or detected by JAX from SLURM, a Cloud TPU pod, Open MPI or Kubernetes),
a check of its port before anything binds it, and a join that ends with one error line instead
of hanging or crashing.

Process 0 runs the coordinator, a gRPC server on the coordinator's port. Should another program
hold that port, JAX's native code crashes process 0 ("Failed to add port", a segmentation
fault) and the other processes wait for a coordinator that never comes. So before JAX starts:
process 0 binds the port itself for a moment, and stops with one line naming the port when it
is taken; every other process connects to the port until something listens there and checks
that it answers as a gRPC (HTTP/2) server does, and stops with one line when what listens
there is something else. Under a cluster manager `coordinator_port` (the --coordinator_port
flag, or JAX's own JAX_COORDINATOR_PORT variable) chooses only the port.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time

import jax

from transformers_jax.errors import UserError

# HTTP/2's client connection preface and an empty SETTINGS frame: a gRPC server answers with a
# SETTINGS frame of its own (RFC 9113, section 3.4)
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS_FRAME = 0x04
ANSWER_TIMEOUT_S = 2.0  # a coordinator answers in milliseconds; a port's other holder never
WRONG_ANSWERS = 3  # tries, a second apart, before a process says the port is not the coordinator's


class JoinError(ValueError):
  """This process could not join the cluster of processes it belongs to."""


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: int = 300,
    coordinator_port: int | None = None,
) -> None:
  """Start JAX's multi-process runtime, then the backends.

  With an address, the given process count and id are used (several processes on one machine,
  or a launcher of one's own); without one, JAX detects a cluster manager (Cloud TPU, SLURM,
  Open MPI, Kubernetes) and a lone process (none detected, or a job of one task) starts no
  runtime. `coordinator_port` replaces the port of the address, given or detected. A cluster
  that is there but cannot be joined within `timeout_s` (a wrong address, a process missing, a
  port taken) is a JoinError: running on as a lone process 0 would have every process write the
  same run.
  """
  if coordinator_port is not None and not 0 < coordinator_port < 65536:
    raise UserError(f"--coordinator_port={coordinator_port}: give a TCP port, 1 to 65535")
  if coordinator_address is None and (num_processes is not None or process_id is not None):
    raise UserError(
        "--num_processes and --process_id go with --coordinator_address=HOST:PORT (without it "
        "a cluster manager's own count and index are used): give all three, or neither"
    )
  if coordinator_address:
    if num_processes is None or process_id is None:
      raise ValueError("--coordinator_address needs --num_processes and --process_id")
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise UserError(
          f"--num_processes={num_processes} --process_id={process_id}: give N >= 1 and an id "
          f"from 0 to N-1, a different one for each process"
      )
    if coordinator_port is None and _split(coordinator_address)[1] is None:
      raise UserError(
          f"--coordinator_address={coordinator_address}: give process 0's host and a free "
          f"port, e.g. --coordinator_address={coordinator_address.strip('[]')}:12355 (or "
          "--coordinator_port)"
      )
    address, detected, local_devices = coordinator_address, False, None
    if coordinator_port is not None:
      host = _split(address)[0]
      address = f"[{host}]:{coordinator_port}" if ":" in host else f"{host}:{coordinator_port}"
  else:
    address, num_processes, process_id, local_devices = _detect(coordinator_port, timeout_s)
    detected = True
    if address is None and coordinator_port is not None:
      raise UserError(
          f"--coordinator_port={coordinator_port}: no cluster manager (SLURM, a Cloud TPU "
          "pod, Open MPI, Kubernetes) was detected around this process: to start processes "
          "yourself give each --coordinator_address=HOST:PORT --num_processes=N --process_id=I"
      )
  if address is not None and num_processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    join = Join(address, num_processes, process_id, detected, timeout_s)
    join.check_port()
    join.initialize(local_devices)
  from transformers_jax.machine import hardware

  hardware.start_backends()


def _detect(coordinator_port: int | None, timeout_s: int):
  """(coordinator address, process count, process id, local device ids) of the cluster manager
  JAX detects around this process, or four Nones. The local device ids are JAX's choice (one
  GPU per task: the task's index on its node), except for a SLURM step of one task per node,
  whose process takes every device of its node (None: all)."""
  from jax._src import clusters

  if coordinator_port is not None:  # JAX's own variable for the port of a detected address
    os.environ["JAX_COORDINATOR_PORT"] = str(coordinator_port)
  address = os.environ.get("JAX_COORDINATOR_ADDRESS")
  try:
    address, count, index, local_ids = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        address, None, None, None, None, timeout_s
    )
  except (RuntimeError, ValueError, OSError, KeyError) as e:
    raise JoinError(f"cannot read the cluster manager's settings for this process: {e}") from None
  if address is None or count is None or index is None:
    return None, None, None, None
  one_task_per_node = "SLURM_STEP_NUM_TASKS" in os.environ and os.environ.get(
      "SLURM_STEP_NUM_TASKS"
  ) == os.environ.get("SLURM_STEP_NUM_NODES")
  return address, int(count), int(index), None if one_task_per_node else local_ids


def _split(address: str) -> tuple[str, int | None]:
  """host and port of "host:port" ("[::1]:port" for IPv6; the port None when absent)."""
  host, sep, port = address.rpartition(":")
  if not sep or not port.isdigit() or (host.count(":") and not host.endswith("]")):
    return address.strip("[]"), None
  return host.strip("[]"), int(port)


def port_taken(port: int, host: str = "") -> bool:
  """Whether a program on this machine listens on TCP `port` (at `host`, '' = any address),
  so that a server could not bind it now. A port left in TIME_WAIT by an ended run is free, as
  it is for gRPC, which binds with SO_REUSEADDR too."""
  tries = [(socket.AF_INET, host or "0.0.0.0")]
  if not host or ":" in host:
    tries.insert(0, (socket.AF_INET6, host or "::"))
  for family, where in tries:
    try:
      probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # no IPv6 here: the IPv4 try tells
      continue
    with probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if family == socket.AF_INET6:
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # v4 and v6, as [::]
      try:
        probe.bind((where, port))
        probe.listen(1)
        return False
      except OSError as e:
        if e.errno == errno.EADDRINUSE:
          return True
  return False


def answers_as_grpc(host: str, port: int, timeout_s: float = ANSWER_TIMEOUT_S) -> bool | None:
  """None when nothing accepts a connection at host:port; else whether what does answers
  HTTP/2's connection preface with a SETTINGS frame, as a gRPC server (JAX's coordinator)
  does."""
  try:
    conn = socket.create_connection((host, port), timeout=timeout_s)
  except OSError:  # refused, unreachable, no such host (yet): nothing there now
    return None
  with conn:
    try:
      conn.sendall(_HTTP2_PREFACE)
      header = b""
      deadline = time.monotonic() + timeout_s
      while len(header) < 9 and time.monotonic() < deadline:
        conn.settimeout(max(deadline - time.monotonic(), 0.01))
        data = conn.recv(9 - len(header))
        if not data:
          break
        header += data
    except OSError:
      return False
  return len(header) == 9 and header[3] == _SETTINGS_FRAME


class Join:
  """One process joining: its checks of the coordinator's port, then JAX's initialize."""

  def __init__(self, address, num_processes, process_id, detected: bool, timeout_s: int):
    self.address, self.num_processes, self.process_id = address, num_processes, process_id
    self.host, self.port = _split(address)
    self.detected, self.timeout_s = detected, timeout_s
    self.deadline = time.monotonic() + timeout_s
    self.who = f"process {process_id} of {num_processes}"

  def how_to_choose_a_port(self) -> str:
    if self.detected:
      return (
          "choose a free port for every process of the job with --coordinator_port=N (or the "
          "environment variable JAX_COORDINATOR_PORT=N)"
      )
    return f"choose a free port for every process with --coordinator_address={self.host}:N"

  def check_port(self) -> None:
    """Process 0: its port must be free. The others: wait until something listens on the
    coordinator's port, and refuse what listens there when it is not a gRPC server."""
    if self.port is None:
      return  # JAX refuses an address without a port itself
    if self.process_id == 0:
      bind = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS")
      host, port = _split(bind) if bind else ("", self.port)
      if port is not None and port_taken(port, "" if host in ("::", "0.0.0.0") else host):
        raise JoinError(
            f"{self.who}: the coordinator's port {port} on this host ({socket.gethostname()}) "
            f"is in use by another program: {self.how_to_choose_a_port()}"
        )
      return
    wrong = 0
    while time.monotonic() < self.deadline:
      answer = answers_as_grpc(self.host, self.port)
      if answer:
        return
      if answer is False:
        wrong += 1
        if wrong >= WRONG_ANSWERS:
          raise JoinError(
              f"{self.who}: port {self.port} on {self.host} answers, but not as JAX's "
              "coordinator: another program holds it, so process 0 cannot serve there; "
              + self.how_to_choose_a_port()
          )
      time.sleep(1.0 if answer is False else 0.25)
    self.give_up()

  def hint(self) -> str:
    if self.detected:
      return (
          f"check that every task of the job runs this command (one per node), that "
          f"{self.address} is reachable from every node, or raise --join_timeout_s"
      )
    return (
        "check that every process was started with the same --coordinator_address (reachable "
        "from every host, process 0's own host and a free port) and --num_processes, or raise "
        "--join_timeout_s"
    )

  def give_up(self):
    where = f"the coordinator at {self.address}"
    print(
        f"error: {self.who} could not join {where} within {self.timeout_s}s: {self.hint()}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(2)

  def initialize(self, local_devices=None) -> None:
    """jax.distributed.initialize (this process's devices: `local_devices`, None = all), with
    a join that does not complete by the deadline reported as one error line and exit code 2.
    (JAX's own deadline ends the process from native code with a page of log; a watchdog
    thread speaks first, and JAX's deadline is set after it.)"""
    left = max(self.deadline - time.monotonic(), 1.0)
    watchdog = threading.Timer(left, self.give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
      jax.distributed.initialize(
          self.address,
          self.num_processes,
          self.process_id,
          local_device_ids=local_devices,
          cluster_detection_method="deactivate",  # detected already, by _detect
          initialization_timeout=int(left) + 60,
      )
    except ValueError as e:  # raised before any connection: not enough to go on
      raise JoinError(f"cannot join the coordinator at {self.address}: {e}") from None
    except RuntimeError as e:  # the connection or the rendezvous failed
      lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
      raise JoinError(
          f"{self.who} could not join the coordinator at {self.address} "
          f"({lines[0][:200] if lines else e!r}): {self.hint()}"
      ) from None
    finally:
      watchdog.cancel()
