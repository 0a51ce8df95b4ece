"""`--compile_only --fit` (train/fit.py): on 8 simulated CPU devices with a memory limit set by
--fit_memory_gib, it finds a layout where the config as given does not fit, keeps the fields set
on the command line, answers a second time from its cache without compiling, exits 3 with one
line naming the closest layout, and refuses the inputs it cannot search; the plain
--compile_only refusal names the knobs --fit would move. One tiny LM (two blocks, a 4,096-token
vocabulary whose logits dominate the step) throughout, compiled a few times in all."""

import json

import jax
import pytest

from conftest import run_python, subprocess_env

# 64 sequences of 64 tokens over 8 devices: about 31 MiB per device as given, 21 MiB with the
# loss four chunks at a time (the logits a quarter at once), whatever the remat policy
TINY = [
    "-m",
    "transformers_jax.train",
    "--config",
    "experiments/gpt2.py:tiny",
    "--compile_only",
    "--config.model.vocab_size=4096",
    "--config.batch_size=64",
    "--config.model.remat=none",  # set on the command line: --fit keeps it
]
MIB = 1 / 1024


def fit(tmp_path, *extra):
  # XLA:CPU's older elemental emitters (the tests' fast compiles) leave the embedding
  # gradients' scatter-adds as while loops, which void XLA's FLOP count of the loop-free programs
  env = subprocess_env(8)
  env["XLA_FLAGS"] = env["XLA_FLAGS"].replace("--xla_cpu_use_fusion_emitters=false", "")
  out = run_python([*TINY, "--fit", f"--fit_cache={tmp_path / 'fit.json'}", *extra], env=env)
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  return out, errors


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("fit")


@pytest.fixture(scope="module")
def first(cache_dir):
  """The search at 25 MiB per device: the step as given needs about 31."""
  out, errors = fit(cache_dir, f"--fit_memory_gib={25 * MIB}")
  assert out.returncode == 0 and not errors, out.stderr[-3000:]
  return out


def test_fit_finds_a_layout_where_the_config_as_given_does_not(first):
  report = json.loads(first.stdout)
  tries = report["fit"]["tries"]
  assert not tries[0]["fits"] and tries[0]["peak_gib"] > 25 * MIB  # the config as given
  assert tries[-1]["fits"] and all(not t["fits"] for t in tries[:-1])  # stops at the first fit
  assert report["fits"] is not False and report["per_device_peak_estimate_gib"] <= 25 * MIB
  assert tries[-1]["changes"]["loss_chunks"] > 1
  assert not any("model.remat" in t["changes"] for t in tries)  # the user's: not searched
  assert report["fit"]["compiles"] == len(tries) + 2  # + the two loop-free FLOPs programs
  assert 0.9 < report["flops_per_model_flop"] < 1.5
  # one progress line per layout, then the command line to paste, which keeps the user's flags
  lines = first.stderr.splitlines()
  assert len([line for line in lines if line.startswith("fit ")]) == len(tries)
  command = [line for line in lines if line.startswith("fits: ")]
  assert len(command) == 1 and command[0].endswith(report["fit"]["flags"])
  assert "--config.batch_size=64" in command[0] and "--fit" not in command[0]
  assert report["fit"]["command"] == command[0][len("fits: ") :]


def test_the_same_search_again_compiles_nothing(first, cache_dir):
  out, errors = fit(cache_dir, f"--fit_memory_gib={25 * MIB}")
  assert out.returncode == 0 and not errors, out.stderr[-3000:]
  again, before = json.loads(out.stdout), json.loads(first.stdout)
  assert again["fit"]["compiles"] == 0 and again["fit"]["cached"] == before["fit"]["compiles"]
  assert again["fit"]["flags"] == before["fit"]["flags"]
  assert again["flops_per_model_flop"] == before["flops_per_model_flop"]
  assert all("(cached)" in line for line in out.stderr.splitlines() if line.startswith("fit "))


def test_no_fitting_layout_exits_3_naming_the_closest(first, cache_dir):
  from transformers_jax.train import fit as fit_lib
  # 4 MiB: nothing fits; the layouts the first search compiled come from the cache, and one
  # more compile (--fit_max_compiles=1) ends the search
  out, errors = fit(cache_dir, f"--fit_memory_gib={4 * MIB}", "--fit_max_compiles=1")
  assert out.returncode == 3, out.stderr[-3000:]
  report = json.loads(out.stdout)
  assert report["fits"] is False and report["fit"]["compiles"] == 1
  closest = min(t["peak_gib"] for t in report["fit"]["tries"])
  assert report["closest"]["peak_gib"] == closest
  assert len(errors) == 1 and "the closest" in errors[0] and report["closest"]["flags"] in errors[0]
  assert f"needs {fit_lib.gib(closest)} ({fit_lib.gib(closest - 4 * MIB)} over)" in errors[0]
  assert "--config.mesh.fsdp" in errors[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["--fit"],
            "--fit searches layouts by compiling the step, not training: add --compile_only",
        ),
        (["--compile_only", "--fit", "--config.population.seeds=2"], "population"),
        (["--compile_only", "--fit_memory_gib=16"], "--fit_memory_gib is read by --fit only"),
        (["--compile_only", "--fit", "--fit_memory_gib=0"], "give a positive size"),
    ],
)
def test_bad_fit_input_is_one_error_line(args, words, tmp_path):
  out = run_python(
      ["-m", "transformers_jax.train", "--config", "experiments/gpt2.py:tiny", *args],
      env=subprocess_env(),
  )
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert out.returncode == 2 and len(errors) == 1 and words in errors[0], out.stderr[-2000:]


def test_the_search_space_leaves_user_fields_and_offers_what_the_config_can_use(experiment):
  from transformers_jax.train import fit

  config = experiment("gpt2", "tiny")
  config.batch_size = 64
  devices = jax.devices()[:1] * 8  # the search space reads only their count and platform
  knobs = dict(fit.searched(config, {"model.remat"}, devices))
  assert "model.remat" not in knobs  # the user's: never searched
  assert "rules.embed" not in knobs and "model.context_strategy" not in knobs  # no context axis
  assert "host_offload" not in knobs  # a CPU has no pinned host memory
  assert knobs["grad_accum_steps"] == [1, 2, 4, 8]  # micro-batches of 32, 16, 8 over 8 devices
  assert knobs["loss_chunks"] == [1, 4, 16] and fit.moves(knobs.items()) == 6
  config.batch_size = 16  # 16 / 4 does not split over 8 devices: 4 and 8 are not offered
  assert dict(fit.searched(config, set(), devices))["grad_accum_steps"] == [1, 2]
  # a context axis adds its sharding rule and ring attention
  config.mesh.context, config.mesh.data = 2, 4
  knobs = dict(fit.searched(config, set(), devices))
  assert knobs["rules.embed"] == [None, "fsdp,context"]
  assert knobs["model.context_strategy"] == ["all_gather", "ring"]
  assert knobs["model.remat"][0] == "none" and knobs["model.remat"][-1] == "full"
  # pipeline stages: a scanned stack whose depth they divide (2 blocks: 2 stages, not 4 or 8),
  # with an axis left to shrink (context 2 x data 4 fill the 8 devices)
  assert "mesh.stage" not in knobs  # looped blocks cannot be split over stages
  config.model.scan_layers = True
  assert "mesh.stage" not in dict(fit.searched(config, set(), devices))
  config.mesh.data = -1
  assert dict(fit.searched(config, set(), devices))["mesh.stage"] == [1, 2]
  config.model.num_layers = 3
  assert "mesh.stage" not in dict(fit.searched(config, set(), devices))


def test_the_refusal_names_the_knobs_fit_moves(experiment):
  from transformers_jax.machine import parallel
  from transformers_jax.train import fit

  config = experiment("gpt2", "tiny")
  hints = " ".join(fit.hints(config, jax.devices()))
  assert "--config.loss_chunks" in hints and "--config.model.remat" in hints
  assert "--config.grad_accum_steps" in hints and "context_strategy" not in hints
  config.model.remat, config.loss_chunks = "full", 16
  assert "remat" not in " ".join(fit.hints(config, jax.devices()))  # nothing left to recompute
  # the activations' embedding is split over tensor by default, as MaxText's rules do
  assert dict(parallel.rules())["act_embed"] == "tensor"
