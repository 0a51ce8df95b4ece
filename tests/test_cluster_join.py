"""Joining a cluster without a cluster manager (tests/test_slurm.py has one): the coordinator's
port checked before JAX binds it, by process 0 (is it free?) and by the others (does what
listens there answer as a gRPC server?); a taken port ends both processes started by hand with
one line each; --coordinator_port where no cluster manager is detected is refused."""

import os
import socket
import subprocess

import pytest

from conftest import ROOT, run_python, start_python, subprocess_env
from test_train import assert_one_line_error, run_cli
from transformers_jax.machine import cluster_join, local_cluster

GPT2_TINY = str(ROOT / "experiments/gpt2.py") + ":tiny"


@pytest.fixture
def holder():
  """A program's socket listening on a port (it never accepts, never answers)."""
  with socket.socket() as s:
    s.bind(("", 0))
    s.listen(8)
    yield s.getsockname()[1]


def test_a_port_someone_listens_on_is_taken_and_a_closed_one_is_free(holder):
  assert cluster_join.port_taken(holder)
  assert cluster_join.port_taken(holder, "127.0.0.1")
  assert not cluster_join.port_taken(local_cluster.free_port())


def test_a_listener_that_is_not_grpc_does_not_pass_for_the_coordinator(holder):
  assert cluster_join.answers_as_grpc("localhost", holder, timeout_s=0.5) is False
  assert cluster_join.answers_as_grpc("localhost", local_cluster.free_port()) is None


def test_a_taken_port_ends_both_processes_with_one_line_each(holder, tmp_path):
  env = {k: v for k, v in subprocess_env().items() if not k.startswith(("SLURM_", "OMPI_"))}
  procs = [
      start_python(
          [
              "-m",
              "transformers_jax.train",
              "--config",
              GPT2_TINY,
              "--workdir",
              str(tmp_path / "w"),
              # the port given apart from the host: with the address, the flag sets its port
              "--coordinator_address=localhost",
              f"--coordinator_port={holder}",
              "--num_processes=2",
              f"--process_id={i}",
          ],
          env=env,
          server=i,  # (each process of a cluster from a fork server of its own)
      )
      for i in range(2)
  ]
  outs = [subprocess.CompletedProcess(p.args, 0, *p.communicate(timeout=240)) for p in procs]
  for p, out in zip(procs, outs):
    out.returncode = p.returncode
  assert_one_line_error(outs[0], f"port {holder}", "in use by another program")
  assert_one_line_error(outs[1], f"port {holder}", "not as JAX's coordinator")
  for out in outs:
    assert out.returncode == 2  # not a crash (-11), and not the join timeout's wait
    assert "--coordinator_address=localhost:N" in out.stderr
    assert "could not join" not in out.stderr
  assert not os.path.exists(tmp_path / "w")  # stopped before the run began


def test_a_coordinator_port_without_a_cluster_manager_is_one_line():
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "TPU_"))}
  out = run_python(
      ["-m", "transformers_jax.train", "--config", GPT2_TINY, "--workdir", "w"]
      + ["--coordinator_port=12345"],
      env=env,
  )
  assert_one_line_error(out, "--coordinator_port=12345", "no cluster manager")
  assert out.returncode == 2
  assert_one_line_error(run_cli("--config", GPT2_TINY, "--coordinator_port=0"), "1 to 65535")
