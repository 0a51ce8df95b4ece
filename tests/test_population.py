"""Population training: members equal their solo runs, a diverged member is masked, resume is
exact, evaluation reports the instability diagnostics; qk_norm and z_loss do what they say."""

import json
import math
import os
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.models import counting
from transformers_jax.errors import UserError
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, example_inputs
from transformers_jax.tasks import cross_entropy
from transformers_jax.train import members as members_lib
from transformers_jax.train import optim, population
from transformers_jax.train.entry import train

from conftest import ROOT, run_python

STEPS = 20
TINY = {
    "steps": STEPS,
    "batch_size": 4,
    "seq_len": 16,
    "log_every": 1,
    "eval_every": 10,
    "eval_batches": 1,
    "checkpoint_every": 10,
    "warmup_steps": 5,
    "learning_rate": 3e-3,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.max_len": 32,
    "model.scan_layers": True,
    "sample.max_new_tokens": 0,
}
# Two seeds x (a sane rate, a rate that overflows the parameters at once) = four members.
POPULATION = {"population.seeds": 2, "population.learning_rates": "(3e-3, 1e30)"}


def make_config(experiment, **fields):
  config = experiment("gpt2", "tiny")
  config.update_from_flattened_dict({**TINY, **fields})
  return config


def lines(workdir):
  text = (pathlib.Path(workdir) / "metrics.jsonl").read_text()
  return [json.loads(x) for x in text.splitlines()]


def member_losses(workdir, member):
  return {x["step"]: x["loss"] for x in lines(workdir) if x.get("member") == member and "loss" in x}


@pytest.fixture(scope="module")
def population_run(experiment, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("population")
  result = train(make_config(experiment, **POPULATION), workdir)
  return workdir, result


def test_members_are_the_product_of_seeds_and_lists(experiment):
  config = make_config(
      experiment,
      **{
          "population.seeds": 3,
          "population.learning_rates": "(1e-3, 1e-2)",
          "population.warmup_steps": "(0, 4)",
      },
  )
  table = members_lib.members(config)
  assert len(table) == 3 * 2 * 2
  assert {(m["seed"], m["learning_rate"], m["warmup_steps"]) for m in table} == {
      (s, lr, w) for s in (0, 1, 2) for lr in (1e-3, 1e-2) for w in (0, 4)
  }
  assert all(m["weight_decay"] == config.weight_decay for m in table)
  assert [m["member"] for m in table] == list(range(12))


@pytest.mark.parametrize("text", ["(1e-3, x)", "()", "(-1e-3,)", "[1e-3, nan]"])
def test_bad_population_lists_are_refused(experiment, text):
  config = make_config(experiment, **{"population.learning_rates": text})
  with pytest.raises(UserError, match="population.learning_rates"):
    members_lib.members(config)


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant", "rsqrt"])
def test_member_schedule_equals_the_solo_schedule(experiment, kind):
  config = make_config(experiment, lr_schedule=kind, steps=50, warmup_steps=7)
  solo = optim.schedule(config)
  # a member's schedule: the same function with the member's peak and warmup as traced scalars
  member = optim.schedule(config, jnp.float32(3e-3), jnp.float32(7))
  steps = jnp.arange(0, 60)
  np.testing.assert_allclose(jax.vmap(member)(steps), jax.vmap(solo)(steps), rtol=1e-6, atol=1e-12)


def test_a_member_trains_as_its_solo_run(experiment, population_run, tmp_path):
  workdir, _ = population_run
  solo = make_config(experiment, seed=1, learning_rate=3e-3)
  train(solo, tmp_path)
  solo_losses = {x["step"]: x["loss"] for x in lines(tmp_path) if "loss" in x}
  member = member_losses(workdir, 2)  # seed 1, learning rate 3e-3
  assert sorted(member) == list(range(1, STEPS + 1)) == sorted(solo_losses)
  np.testing.assert_allclose(
      [member[s] for s in sorted(member)], [solo_losses[s] for s in sorted(member)], atol=1e-5
  )
  solo_eval = [x for x in lines(tmp_path) if "eval_loss" in x][-1]
  assert len(solo_eval["attention_logit_max"]["decoder"]) == 2  # solo runs report it too
  # the two seeds differ (parameters and batches are the seed's)
  assert member_losses(workdir, 0)[STEPS] != member[STEPS]


def test_each_member_starts_from_its_solo_runs_initial_state(experiment):
  """The population's init (members made one after the other on one device) gives every member
  exactly the parameters and optimizer state its solo run starts from."""
  from transformers_jax.train.setup import Setup

  pop = jax.device_get(Setup(make_config(experiment, **POPULATION)).init_state())
  for member, seed in ((0, 0), (3, 1)):  # members 0-1 have seed 0, 2-3 seed 1
    solo = jax.device_get(Setup(make_config(experiment, seed=seed)).init_state())
    for part in ("params", "opt_state", "rng"):
      mine = members_lib.member(getattr(pop, part), member)
      assert jax.tree_util.tree_all(
          jax.tree_util.tree_map(np.array_equal, mine, getattr(solo, part))
      ), part


def test_a_diverged_member_is_marked_and_the_others_carry_on(population_run):
  workdir, result = population_run
  final = {m["member"]: m for m in result["members"]}
  for i in (1, 3):  # learning rate 1e30
    assert final[i]["diverged"] and 1 <= final[i]["diverged_at"] <= STEPS
  for i in (0, 2):
    assert not final[i]["diverged"] and math.isfinite(final[i]["loss"])
    assert final[i]["loss"] < math.log(256)  # learned something
  last = [x for x in lines(workdir) if x["step"] == STEPS and "loss" in x]
  assert [x["diverged"] for x in sorted(last, key=lambda x: x["member"])] == [
      False,
      True,
      False,
      True,
  ]


def test_evaluation_reports_logit_diagnostics_per_member(population_run):
  workdir, _ = population_run
  evals = [x for x in lines(workdir) if "eval_loss" in x]
  assert sorted({(x["step"], x["member"]) for x in evals}) == [
      (s, m) for s in (10, 20) for m in range(4)
  ]
  healthy = [x for x in evals if x["member"] in (0, 2)]
  for x in healthy:
    assert len(x["attention_logit_max"]["decoder"]) == 2  # one per block
    assert all(math.isfinite(v) for v in x["attention_logit_max"]["decoder"])
    assert x["eval_logit_max"] >= x["eval_logit_mean"]
    assert math.isfinite(x["eval_loss"])
  assert any((pathlib.Path(workdir) / "tb").glob("events*")), "TensorBoard events are written"


def test_resume_is_bit_exact(experiment, population_run, tmp_path):
  workdir, _ = population_run
  config = make_config(experiment, **POPULATION, stop_after=10)
  train(config, tmp_path)
  assert max(x["step"] for x in lines(tmp_path)) == 10
  config = make_config(experiment, **POPULATION)
  train(config, tmp_path)
  for member in range(4):
    resumed, straight = member_losses(tmp_path, member), member_losses(workdir, member)
    assert [resumed[s] for s in range(11, STEPS + 1)] == [
        straight[s] for s in range(11, STEPS + 1)
    ] or all(math.isnan(resumed[s]) and math.isnan(straight[s]) for s in range(11, STEPS + 1))
  # resuming with other members is refused
  config = make_config(experiment, **{**POPULATION, "population.learning_rates": "(1e-3, 1.0)"})
  with pytest.raises(UserError, match="other members"):
    train(config, tmp_path)


def test_sigterm_saves_and_a_damaged_checkpoint_is_not_resumed(experiment, tmp_path, monkeypatch):
  """A population stops on SIGTERM like a solo run (saves the step, one error line), and its
  resume verifies the checkpoint's checksums."""
  import signal

  class SignalAtStep2(population.StopRequests):

    def stop_at(self, step):
      if step == 2:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the run's handler right here
      return super().stop_at(step)

  monkeypatch.setattr(population, "StopRequests", SignalAtStep2)
  handler_before = signal.getsignal(signal.SIGTERM)
  config = make_config(experiment, **{**POPULATION, "population.seeds": 1})
  with pytest.raises(UserError, match=r"interrupted \(SIGTERM\): saved step 2 in "):
    train(config, tmp_path)
  assert signal.getsignal(signal.SIGTERM) is handler_before  # the handlers are put back
  step_dir = tmp_path / "checkpoints" / "2"
  assert "2" in json.loads((tmp_path / "checkpoints" / "checksums.json").read_text())
  target = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  raw = bytearray(target.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  target.write_bytes(bytes(raw))
  with pytest.raises(UserError, match="no intact checkpoint .* step\\(s\\) 2 are damaged"):
    train(config, tmp_path)
  assert (tmp_path / "checkpoints" / "2.damaged").is_dir()


def _largest_logit(c, scale_qk: float) -> float:
  """The largest first-block attention logit with the query and key kernels scaled up."""
  model = build_model(c)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), *example_inputs(c))["params"])

  def grow(path, x):
    names = jax.tree_util.keystr(path)
    return x * scale_qk if ("'query'" in names or "'key'" in names) else x

  params = jax.tree_util.tree_map_with_path(grow, params)
  _, state = model.apply({"params": params}, *example_inputs(c), mutable=["intermediates"])
  return float(state["intermediates"]["decoder"]["layer_0"]["self_attn"]["attention_logit_max"][0])


def test_qk_norm_normalises_queries_and_keys_and_is_counted():
  c = ModelConfig(qk_norm=True, d_model=32, num_heads=2, max_len=16)
  model = build_model(c)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), *example_inputs(c))["params"])
  attn = params["decoder"]["layer_0"]["self_attn"]
  assert attn["query_norm"]["scale"].shape == (16,) == attn["key_norm"]["scale"].shape
  assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == counting.count(c)
  # unit-scale normalised queries and keys: a logit is at most |q||k|/sqrt(K) = sqrt(K) = 4,
  # however large the projections grow; without the norms the logits grow with them
  assert _largest_logit(c, 100.0) <= 4.0 + 1e-4
  assert _largest_logit(c.replace(qk_norm=False), 100.0) > 100.0
  with pytest.raises(ValueError, match="model.qk_norm"):
    ModelConfig(qk_norm="yes")


def test_z_loss_adds_the_squared_log_partition():
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 7)) * 3
  targets = jnp.zeros((2, 3), jnp.int32)
  weights = jnp.ones((2, 3))
  plain = cross_entropy(logits, targets, weights)
  with_z = cross_entropy(logits, targets, weights, z_loss=1e-2)
  lse = jax.nn.logsumexp(logits, axis=-1)
  np.testing.assert_allclose(with_z["loss"] - plain["loss"], 1e-2 * jnp.sum(lse**2), rtol=1e-5)
  np.testing.assert_allclose(plain["z_loss"], jnp.sum(lse**2), rtol=1e-6)
  assert plain["nll"] == with_z["nll"]


def test_members_split_over_devices_train_as_on_one(population_run, tmp_path):
  """The same population on two CPU devices (two members each) logs the same losses."""
  workdir, result = population_run
  assert result["member_devices"] == 1
  flags = [f"--config.{k}={v}" for k, v in {**TINY, **POPULATION}.items()]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = run_python(
      ["-m", "transformers_jax.train", "--cpu_devices=2"]
      + ["--config", str(ROOT / "experiments" / "gpt2.py:tiny"), f"--workdir={tmp_path}"]
      + flags
      + ["--config.eval_every=0", "--config.checkpoint_every=0"],
      env=env,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "split over 2 device(s)" in proc.stdout
  for member in (0, 2):
    split, one = member_losses(tmp_path, member), member_losses(workdir, member)
    np.testing.assert_allclose(
        [split[s] for s in sorted(one)], [one[s] for s in sorted(one)], atol=1e-5
    )


def test_lr_sensitivity_figure_of_merit():
  sys.path.insert(0, str(ROOT / "scripts"))
  import lr_sensitivity

  initial = math.log(256)
  flat = {1e-3: [2.0, 2.0], 1e-2: [2.0, 2.0]}
  assert lr_sensitivity.lr_sensitivity(flat, initial) == (0.0, 1e-3, 2.0)
  # one rate at the best loss, one diverged (capped at the initial loss): half the gap
  sens, best_lr, best = lr_sensitivity.lr_sensitivity({1e-3: [2.0], 1e-1: [initial]}, initial)
  assert (best_lr, best) == (1e-3, 2.0) and sens == pytest.approx((initial - 2.0) / 2)
  record = {
      "vocab_size": 256,
      "members": [
          {"learning_rate": 1e-3, "warmup_steps": 0, "eval_loss": 2.5, "diverged": False},
          {"learning_rate": 1e-1, "warmup_steps": 0, "eval_loss": float("nan"), "diverged": True},
          {"learning_rate": 1e-1, "warmup_steps": 0, "eval_loss": 9.0, "diverged": False},
      ],
  }
  assert lr_sensitivity.curves(record) == {0: {1e-3: [2.5], 1e-1: [initial, initial]}}


def test_lr_sensitivity_grid_covers_the_study():
  sys.path.insert(0, str(ROOT / "scripts"))
  import lr_sensitivity

  sweep = lr_sensitivity.load_sweep(ROOT / "experiments" / "lr_sensitivity.py")
  entries = sweep.populations()
  configs = [lr_sensitivity.population_config(sweep, e, ROOT / "unused") for e in entries]
  assert len({e["name"] for e in entries}) == len(entries) == 3 * 2 * 2
  assert {(c.model.norm_placement, c.model.qk_norm, c.model.num_layers) for c in configs} == {
      (p, q, d) for p in ("pre", "post", "sandwich") for q in (False, True) for d in (2, 4)
  }
  for c in configs:
    table = members_lib.members(c)
    rates = sorted({m["learning_rate"] for m in table})
    assert len(rates) >= 7 and rates[0] <= 1e-4 and rates[-1] >= 1e-1
    assert len({m["seed"] for m in table}) >= 3 and c.steps >= 1000
    assert {m["warmup_steps"] for m in table} == {0, c.steps // 10}


# ----------------------------------------------------------------------------- member == solo
def _member_and_solo(config_of, tmp_path, member_fields):
  """Train a two-member population and the solo run of its member 0: their logged losses."""
  train(config_of(**member_fields), tmp_path / "population")
  train(config_of(), tmp_path / "solo")
  solo = {x["step"]: x["loss"] for x in lines(tmp_path / "solo") if "loss" in x}
  return member_losses(tmp_path / "population", 0), solo


# One block, looped: the members' step is what these check, for the other two objectives; the
# gpt2 population above trains a scanned stack (tracing and initialising a scan costs more).
ONE_LOOPED_BLOCK = {"model.num_layers": 1, "model.scan_layers": False}


@pytest.mark.parametrize(
    "family, fields",
    [
        ("bert", ONE_LOOPED_BLOCK),  # masked LM
        ("transformer", {**ONE_LOOPED_BLOCK, "seq_len": 32, "data.max_number": 999}),
    ],
)
def test_a_member_equals_its_solo_run_for_mlm_and_seq2seq(
    experiment, tmp_path, family, fields, capsys
):
  def config_of(**extra):
    config = experiment(family, "tiny")
    config.update_from_flattened_dict(
        {**TINY, "eval_every": 0, "checkpoint_every": 0, **fields, **extra}
    )
    return config

  member, solo = _member_and_solo(
      config_of, tmp_path, {"population.learning_rates": "(3e-3, 1e-2)"}
  )
  # the console: the population's best loss and best held-out loss name their member; the
  # encoder-decoder's evaluation leads with what greedy decoding gets right
  said = capsys.readouterr().out
  best = re.search(r"step 20/20: 2/2 members training, best loss ([\d.]+) \(member (\d): ", said)
  final = {i: member_losses(tmp_path / "population", i)[STEPS] for i in (0, 1)}
  assert best and float(best.group(1)) == pytest.approx(min(final.values()), abs=1e-4)
  assert int(best.group(2)) == min(final, key=final.get)
  assert re.search(r"step 20/20: eval best loss [\d.]+ acc [\d.]+ .*by member \d: seed 0, ", said)
  if family == "transformer":
    assert re.search(
        r"step 20/20: eval greedy exact match [\d.]+ BLEU [\d.]+; teacher-forced", said
    )
    assert re.search(r"eval best loss .*\(greedy exact match [\d.]+ BLEU [\d.]+\) by member", said)
  assert sorted(member) == sorted(solo) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([member[s] for s in solo], list(solo.values()), rtol=1e-5)
  assert solo[STEPS] < solo[1]  # it trained


def test_a_member_equals_its_solo_run_on_packed_jsonl_over_fsdp(tmp_path):
  """Two CPU devices, parameters split over fsdp=2, documents of a .jsonl file packed."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = run_python([str(ROOT / "tests/population_worker.py"), str(tmp_path)], env=env)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert "each member over mesh axes {'fsdp': 2}" in proc.stdout
  assert json.loads((tmp_path / "member_devices.json").read_text()) == 1
  solo = {x["step"]: x["loss"] for x in lines(tmp_path / "solo") if "loss" in x}
  member = member_losses(tmp_path / "population", 0)
  assert sorted(member) == sorted(solo) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([member[s] for s in solo], list(solo.values()), rtol=1e-5)
  assert member_losses(tmp_path / "population", 1)[STEPS] != member[STEPS]


# ----------------------------------------------------------------------------- other tools
def test_other_tools_take_one_member_of_a_population(experiment, population_run, tmp_path, capsys):
  from transformers_jax.run_folder.runs import Run, load_run
  from transformers_jax.errors import RunError

  workdir, _ = population_run
  with pytest.raises(RunError, match=r"population of 4 members: pass --member=I with I in 0..3"):
    load_run(workdir)
  with pytest.raises(RunError, match="--member=7"):
    load_run(workdir, member=7)
  # a member that diverged does not make the checkpoint look damaged to the others
  _, params, _, step = load_run(workdir, member=2)
  assert step == STEPS and not (pathlib.Path(workdir) / "checkpoints" / f"{STEPS}.damaged").exists()
  whole = Run(workdir).checkpoints(async_save=False).restore(STEPS, None)["params"]
  for got, stacked in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(whole)):
    np.testing.assert_array_equal(got, stacked[2])
  # generate names the flag, in one line
  proc = run_python(
      ["-m", "transformers_jax.generate", f"--workdir={workdir}", "--prompt=a"],
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: ")
  assert "pass --member=I" in proc.stderr and "Traceback" not in proc.stderr
  # init_from a population: the member flag is required, then that member's tensors are taken
  config = make_config(experiment, init_from=str(workdir), steps=1, eval_every=0)
  with pytest.raises(UserError, match="pass --config.init_member=I"):
    train(config, tmp_path / "a")
  config = make_config(experiment, init_from=str(workdir), init_member=2, steps=1, eval_every=0)
  capsys.readouterr()
  train(config, tmp_path / "b")
  said = capsys.readouterr().out
  assert f"initialised {len(jax.tree_util.tree_leaves(params))} tensors from {workdir}" in said
  # each tool says which member it took: index, how many, seed and hyperparameters, step
  taken = "member 2 of 4 (seed 1, learning_rate 0.003, weight_decay 0.1"
  assert f"(step {STEPS}, {taken}" in said
  from transformers_jax.convert import export_hf

  export_hf(workdir, tmp_path / "hf", member=2)
  assert f"exporting {taken}" in capsys.readouterr().out
  proc = run_python(
      ["-m", "transformers_jax.generate", f"--workdir={workdir}", "--member=2"]
      + ["--prompt_ids=1", "--max_new_tokens=1", "--temperature=0"],
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"generating with {taken}" in proc.stderr and f"step {STEPS}" in proc.stderr


def test_compile_only_compiles_the_population_step(experiment):
  """--compile_only of a population reports the members' step: its arguments hold every
  member's state (four members: about four times one model's), and its model FLOPs are every
  member's."""
  from transformers_jax.train import compile as compile_step

  solo = compile_step.report(make_config(experiment), verbose=False)
  pop = compile_step.report(make_config(experiment, **POPULATION), verbose=False)
  assert pop["population_members"] == 4 and "population_members" not in solo
  ratio = pop["per_device_argument_gib"] / solo["per_device_argument_gib"]
  assert 3.9 < ratio < 4.1, ratio
  assert pop["model_flops_per_step"] == 4 * solo["model_flops_per_step"]


# ------------------------------------------------------------------------- comparing runs
def test_compare_tables_and_plots_runs_and_members(population_run, tmp_path):
  """python -m transformers_jax.compare: final and best figures per run or member (a member that
  diverged keeps its best finite loss), from metrics.jsonl as a resume and a kill leave it, and
  a PNG of the loss curves."""
  from transformers_jax import compare

  workdir, _ = population_run
  members = compare.curves(str(workdir))  # a population alone: every member, named by what varies
  assert [label.split(" (")[0] for label, _ in members] == [f"{workdir}:{i}" for i in range(4)]
  assert members[3][0].endswith("(seed 1, learning_rate 1e+30)")
  # a solo run resumed from step 2 (steps 3-4 logged again) and killed while writing a line
  solo = tmp_path / "solo"
  solo.mkdir()
  (solo / "metrics.jsonl").write_text(
      '{"step": 2, "loss": 3.0}\n{"step": 4, "loss": 2.0}\n'
      '{"step": 4, "eval_loss": 2.5, "eval_accuracy": 0.4}\n'
      '{"step": 3, "loss": 2.8}\n{"step": 4, "loss": 2.2}\n'
      '{"step": 4, "eval_loss": 2.6, "eval_accuracy": 0.3}\n{"step": 5, "lo'
  )
  diverged = {x["step"]: x["loss"] for x in lines(workdir) if x.get("member") == 3 and "loss" in x}
  assert not math.isfinite(diverged[STEPS])
  best_step = min((s for s in diverged if math.isfinite(diverged[s])), key=diverged.get)
  proc = run_python(
      ["-m", "transformers_jax.compare", str(solo), f"{workdir}:3"]
      + [f"--plot={tmp_path / 'curves.png'}"]
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  header, _, solo_row, member_row = proc.stdout.splitlines()[:4]
  assert header.split()[:3] == ["run", "steps", "loss:"] and "eval_accuracy:" in header
  assert solo_row.split()[:2] == [str(solo), "4"]
  assert "2.2000, 2.2000 @4" in solo_row and "2.6000, 2.6000 @4" in solo_row
  assert "0.3000, 0.3000 @4" in solo_row  # the resumed lines replace the first ones
  assert member_row.startswith(f"{workdir}:3 ") and f" {STEPS} " in member_row
  assert f"{diverged[STEPS]:.4f}, {diverged[best_step]:.4f} @{best_step}" in member_row
  png = tmp_path / "curves.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"loss curves: {png}" in proc.stdout
  for spec, said in (
      (f"{workdir}:9", "holds members 0..3"),
      (f"{solo}:0", "holds one model, not a population"),
      (str(tmp_path / "none"), "no such run folder"),
  ):
    with pytest.raises(UserError, match=said):
      compare.curves(spec)
