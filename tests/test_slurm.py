"""The SLURM batch script on a real one-node cluster (slurmctld and slurmd on localhost, started
by scripts/cluster/local_slurm_up.sh): `sbatch scripts/cluster/train.sbatch` trains gpt2:tiny
with two tasks joined as one JAX cluster to the end; `scancel` makes both save the same step;
the resubmitted job, signalled again, requeues itself and resumes; the run so stopped twice
ends with the uninterrupted run's losses bit for bit; a taken coordinator port ends every
process with one line; population.sbatch trains two members, one on each process.

The cluster needs root and apt-get (it installs slurm-wlm and munge when missing); where the
setup script cannot run it says why and these tests are skipped with its line."""

import json
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, subprocess_env

pytestmark = pytest.mark.slurm

UP = ROOT / "scripts" / "cluster" / "local_slurm_up.sh"
DOWN = ROOT / "scripts" / "cluster" / "local_slurm_down.sh"
BATCH = ROOT / "scripts" / "cluster" / "train.sbatch"
POPULATION = ROOT / "scripts" / "cluster" / "population.sbatch"
CANNOT = 77  # local_slurm_up.sh: this machine cannot host the cluster
SAVED_AND_STOPPED = 75
# Long enough that a signal lands before the end: a step takes about 10 ms, and a scancel can
# take effect 15 steps or more after the step the test waited for.
STEPS = 120
TRAIN = [
    "experiments/gpt2.py:tiny",
    # the workdir goes here
    f"--config.steps={STEPS}",
    "--config.log_every=1",
    "--config.eval_every=0",
    "--config.checkpoint_every=0",  # only the signal saves
    "--config.sample.max_new_tokens=0",
    "--config.data.max_bytes=200000",
    "--config.device_peak_flops=1e12",  # (no peak measurement at start)
    # one block: what the jobs check (joining, signals, requeues, resumes) does not depend on
    # depth, and each of the dozen processes compiles and steps for less
    "--config.model.num_layers=1",
]
WAIT_S = 240  # how long a job may take before a test gives up on it (a broken cluster)


@pytest.fixture(scope="module")
def cluster():
  """The environment that reaches the local cluster (SLURM_CONF), for the job's processes too
  (sbatch hands the environment on)."""
  env = subprocess_env()
  up = subprocess.run(["bash", str(UP)], capture_output=True, text=True, timeout=150, env=env)
  if up.returncode == CANNOT:
    pytest.skip(up.stderr.strip().splitlines()[-1])
  assert up.returncode == 0, up.stderr[-3000:]
  env["SLURM_CONF"] = re.search(r"export SLURM_CONF=(\S+)", up.stdout).group(1)
  env["PYTHON"] = sys.executable
  env["PYTHONPATH"] = ":".join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
  yield env
  subprocess.run(["bash", str(DOWN)], capture_output=True, env=env, timeout=60)


def submit(env, out, workdir, *flags, script=BATCH):
  """Submit a batch script (train.sbatch) with two tasks on the one node; the job id."""
  done = subprocess.run(
      [
          "sbatch",
          "--parsable",
          "--nodes=1",
          "--ntasks=2",
          "--ntasks-per-node=2",
          f"--output={out}",
          str(script),
          TRAIN[0],
          str(workdir),
          *TRAIN[1:],
          *flags,
      ],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=env,
      timeout=30,
  )
  assert done.returncode == 0, done.stderr
  return done.stdout.strip().split(";")[0]


def job(env, job_id) -> dict:
  """scontrol's fields of the job (JobState, Reason, ExitCode, Restarts ...)."""
  text = subprocess.run(
      ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, env=env
  ).stdout
  return dict(re.findall(r"(\w+)=(\S*)", text))


def wait_for(condition, what: str):
  deadline = time.monotonic() + WAIT_S
  while not condition():
    assert time.monotonic() < deadline, f"gave up waiting for {what}"
    time.sleep(0.2)


def ended(env, job_id) -> dict:
  """The job's fields once it has ended."""
  fields = {}

  def over():
    fields.update(job(env, job_id))
    return fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

  wait_for(over, f"job {job_id} to end")
  return fields


def logged(out, step: int):
  return lambda: out.exists() and f"0: step {step}/" in out.read_text()


def losses(workdir) -> dict:
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(line) for line in lines]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def saved_steps(text: str) -> dict[str, int]:
  """task -> the step its 'saved step N' line names."""
  return {
      task: int(step)
      for task, step in re.findall(
          r"^(\d): error: interrupted \(SIGTERM\): " r"saved step (\d+) ", text, re.M
      )
  }


@pytest.fixture(scope="module")
def side_jobs(cluster, tmp_path_factory):
  """The jobs that need no other: a job whose coordinator port another program holds (a
  socket that listens and never answers, open until the fixture ends), and a population sweep;
  submitted first, so that they run beside the others (the node has 8 CPUs)."""
  base = tmp_path_factory.mktemp("slurm_side")
  with socket.socket() as holder:
    holder.bind(("", 0))
    holder.listen(8)
    port = holder.getsockname()[1]
    taken = submit(cluster, base / "taken.out", base / "taken", f"--coordinator_port={port}")
    sweep = submit(
        cluster,
        base / "sweep.out",
        base / "sweep",
        "--config.steps=3",
        "--config.population.seeds=2",
        "--config.mesh.data=-1",
        "--config.mesh.fsdp=1",
        script=POPULATION,
    )
    yield {"port": port, "taken": (taken, base / "taken.out"), "sweep": (sweep, base)}
    ended(cluster, taken)  # (the port stays held until its job is over)


@pytest.fixture(scope="module")
def uninterrupted(cluster, side_jobs, tmp_path_factory):
  base = tmp_path_factory.mktemp("slurm_whole")
  out, workdir = base / "job.out", base / "run"
  job_id = submit(cluster, out, workdir)
  return ended(cluster, job_id), out.read_text(), workdir


@pytest.fixture(scope="module")
def interrupted(cluster, tmp_path_factory):
  """The same run, cancelled with `scancel` at step 5, submitted again, signalled with
  `scancel --signal=TERM` 10 or more steps after the step the first job saved (at 20 at the
  earliest; the job requeues itself) and so resumed to the end."""
  base = tmp_path_factory.mktemp("slurm_stopped")
  workdir = base / "run"
  first_out, second_out = base / "first.out", base / "second.out"
  first = submit(cluster, first_out, workdir)
  wait_for(logged(first_out, 5), "the first job's step 5")
  subprocess.run(["scancel", first], env=cluster, check=True)
  first_fields = ended(cluster, first)
  # the signal lands some steps after step 5; the resumed job logs only the steps after it
  first_saved = saved_steps(first_out.read_text()).get("0", 5)
  second_signal_step = max(20, first_saved + 10)
  second = submit(cluster, second_out, workdir)
  wait_for(logged(second_out, second_signal_step), f"the second job's step {second_signal_step}")
  subprocess.run(["scancel", "--signal=TERM", second], env=cluster, check=True)
  # the job requeues itself; it may start again once its credentials expired (10 s on the
  # local cluster: AuthInfo=cred_expire=10)
  wait_for(lambda: job(cluster, second).get("Restarts") == "1", "the requeue")
  second_fields = ended(cluster, second)
  return workdir, (first_fields, first_out.read_text()), (second_fields, second_out.read_text())


def test_the_batch_script_trains_with_two_joined_processes_to_the_end(uninterrupted):
  fields, text, workdir = uninterrupted
  assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", text[-3000:]
  assert "over 2 cpu devices" in text  # both processes joined one cluster: 2 devices
  run = json.loads((workdir / "run.json").read_text())
  assert run["process_count"] == 2 and run["device_count"] == 2
  assert sorted(losses(workdir)) == list(range(1, STEPS + 1))


def test_scancel_makes_both_processes_save_the_same_step(interrupted):
  _, (fields, text), _ = interrupted
  saved = saved_steps(text)
  assert set(saved) == {"0", "1"} and saved["0"] == saved["1"] >= 5, text[-3000:]
  assert "Exited with exit code 75" in text  # saved and stopped, not failed (2)
  assert fields["JobState"] == "CANCELLED" and "requeued" not in text  # a cancel: not requeued


def test_a_signal_to_the_run_requeues_the_job_which_resumes(interrupted):
  workdir, (_, first_text), (fields, text) = interrupted
  first_saved = saved_steps(first_text)["0"]
  saved = saved_steps(text)
  assert set(saved) == {"0", "1"} and saved["0"] == saved["1"] >= 20, text[-3000:]
  assert f"resumed from step {first_saved};" in text
  assert f"requeued, to resume from {workdir}" in text
  assert f"resumed from step {saved['0']};" in text.split("(start 2)")[1]
  assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0"
  assert fields["Restarts"] == "1"


def test_the_twice_stopped_run_ends_with_the_uninterrupted_losses_bit_for_bit(
    uninterrupted, interrupted
):
  whole = losses(uninterrupted[2])
  stopped = losses(interrupted[0])
  assert sorted(stopped) == list(range(1, STEPS + 1))  # every step once: nothing repeated
  assert stopped[STEPS] == whole[STEPS]
  assert stopped == whole


def test_a_taken_coordinator_port_ends_every_process_with_one_line(cluster, side_jobs):
  """Another program listens on the coordinator's port: process 0 says so before JAX binds it
  (JAX would crash it), process 1 finds that the port does not answer as a coordinator; the
  job ends without anyone waiting out --join_timeout_s (300 s)."""
  (job_id, out), port = side_jobs["taken"], side_jobs["port"]
  fields = ended(cluster, job_id)
  text = out.read_text()
  assert fields["ExitCode"] == "2:0", text[-3000:]
  for task in ("0", "1"):
    errors = [line for line in text.splitlines() if line.startswith(f"{task}: error:")]
    assert len(errors) == 1, text[-3000:]
    assert f"port {port}" in errors[0] and "--coordinator_port=N" in errors[0], errors
  assert "in use by another program" in text and "not as JAX's coordinator" in text
  assert not re.search(r"Segmentation fault|core dumped|Failed to add port|signal 11", text)
  assert "could not join" not in text  # nobody waited for the join to time out


def test_the_population_script_trains_members_split_over_the_processes(cluster, side_jobs):
  """Two members over the `data` axis of two processes' devices: each process holds one; the
  logs and the evaluation gather them from both."""
  job_id, base = side_jobs["sweep"]
  fields = ended(cluster, job_id)
  text = (base / "sweep.out").read_text()
  assert fields["ExitCode"] == "0:0", text[-3000:]
  assert "population of 2 decoder models" in text and "split over 2 device(s)" in text
  rows = [json.loads(line) for line in (base / "sweep" / "metrics.jsonl").read_text().splitlines()]
  last = {r["member"]: r for r in rows if r.get("step") == 3 and "loss" in r}
  assert sorted(last) == [0, 1] and last[0]["loss"] != last[1]["loss"]  # two seeds
  assert {r["member"] for r in rows if "eval_loss" in r} == {0, 1}
