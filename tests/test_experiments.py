"""Experiments: the sweep runner, scripts/lr_sensitivity.py (outputs, skip, resume, divergence),
the norm-ablation grid it reruns, and the lesson scripts' numbers against the lesson's formulas."""

import ast
import importlib.util
import contextlib
import io
import json
import math
import re

import numpy as np
import pytest

from conftest import ROOT, lesson_positional_encoding

TOY_SWEEP = """
BASE = "gpt2.py:tiny"
COMMON = {"steps": 6, "log_every": 2, "eval_every": 0, "eval_batches": 2, "checkpoint_every": 3,
          "sample.max_new_tokens": 0, "batch_size": 4, "seq_len": 16,
          "model.num_layers": 1, "model.d_model": 32, "model.num_heads": 2,
          "population.warmup_steps": "(0,)"}

def populations(scale=False):
  return [{"name": "ok", "overrides": dict(COMMON, **{"population.learning_rates": "(1e-3,)"})},
          {"name": "blows-up", "overrides": dict(COMMON, **{"model.norm_placement": "post",
                                                            "population.learning_rates":
                                                            "(1e-3, 1e12)"})}]
"""


def script(name):
  spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_main(module, *args):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    module.main(list(args))
  return out.getvalue()


def jsonl(path):
  return [json.loads(x) for x in path.read_text().splitlines()]


def test_sweep_runs_skips_finished_points_and_resumes(tmp_path):
  lr = script("lr_sensitivity")
  from transformers_jax.train.entry import train

  sweep_file = tmp_path / "toy.py"
  sweep_file.write_text(TOY_SWEEP)
  out = tmp_path / "out"
  args = ("--sweep", str(sweep_file), "--out", str(out))
  # a sweep killed half way through its first population: a checkpoint at step 3, no record
  sweep = lr.load_sweep(sweep_file)
  ok = sweep.populations()[0]
  config = lr.population_config(sweep, ok, out)
  config.stop_after = 3
  train(config, str(out / "runs" / "ok"))
  first = run_main(lr, *args, "--max_populations", "1")
  assert "2 populations: 0 finished, 1 to run now" in first and "[1/1] ok" in first
  assert [r["name"] for r in jsonl(out / "populations.jsonl")] == ["ok"]
  second = run_main(lr, *args)
  assert "2 populations: 1 finished, 1 to run now" in second and "[1/1] blows-up" in second
  records = {r["name"]: r for r in jsonl(out / "populations.jsonl")}
  assert set(records) == {"ok", "blows-up"}
  # the killed invocation logged steps 2 and 3; the resumed one carried on from the step-3
  # checkpoint, no step twice
  logged = [x["step"] for x in jsonl(out / "runs" / "ok" / "metrics.jsonl") if "loss" in x]
  assert logged == [2, 3, 4, 6]
  (member,) = records["ok"]["members"]
  assert not member["diverged"] and math.isfinite(member["eval_loss"])
  assert [m["diverged"] for m in records["blows-up"]["members"]] == [False, True]
  assert not (out / "runs" / "ok" / "checkpoints").exists()  # finished ones drop checkpoints
  table = (out / "table.md").read_text()
  assert "| 1 | pre | off | 0 |" in table and "| 1 | post | off | 0 |" in table
  assert "| 0/1 |" in table and "| 1/2 |" in table
  import matplotlib.image

  for name in ("loss_vs_lr.png", "attention_logits.png"):
    data = (out / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(out / name).ndim == 3
  before = (out / "populations.jsonl").read_text()
  third = run_main(lr, *args)
  assert "2 populations: 2 finished, 0 to run now" in third and "[" not in third
  assert (out / "populations.jsonl").read_text() == before
  assert (out / "table.md").read_text() == table


def test_row_progress_says_each_row_and_the_time_left(monkeypatch):
  """Long scripts' progress (plan_scale, bench_population, moe_capacity, lr_sensitivity): a line
  as each row starts and ends, the time left scaled by the rows' work (a warm-up counts none)."""
  from transformers_jax.scripting import sweeps

  times = iter([0.0, 0.0, 5.0, 5.0, 15.0, 15.0, 45.0])  # the clock at each call
  monkeypatch.setattr(sweeps.time, "perf_counter", lambda: next(times))
  out = io.StringIO()
  progress = sweeps.RowProgress([0, 1, 3], stream=out)
  for name, said in (("warm-up", ""), ("small", "fits"), ("large", "fits")):
    progress.start(name)
    progress.finish(name, said)
  assert out.getvalue().splitlines() == [
      "[1/3] warm-up ...",
      "[1/3] warm-up done (took 5s) | 5s elapsed",
      "[2/3] small ...",
      "[2/3] small: fits (took 10s) | 15s elapsed, ~30s left",
      "[3/3] large ...",
      "[3/3] large: fits (took 30s) | 45s elapsed",
  ]
  assert sweeps.clock(3725) == "1h02m" and sweeps.clock(65) == "1m05s"


def test_norm_ablation_grid():
  """The norm ablation reruns through lr_sensitivity.py: its 37 models are populations of the
  warmups, one seed at one learning rate each."""
  lr = script("lr_sensitivity")
  sweep = lr.load_sweep(ROOT / "experiments" / "norm_ablation.py")
  entries = sweep.populations()
  assert len({e["name"] for e in entries}) == len(entries)
  configs = [lr.population_config(sweep, e, ROOT / "unused") for e in entries]  # every override
  seen = set()
  for c in configs:
    assert c.population.seeds == 1 and ast.literal_eval(c.population.learning_rates) == (3e-3,)
    for w in ast.literal_eval(c.population.warmup_steps):
      m = c.model
      seen.add((m.norm_placement, m.norm, m.num_layers, w, m.residual))
  assert len(seen) == 3 * 2 * 3 * 2 + 1
  assert {
      (pl, n, d, w, True)
      for pl in ("pre", "post", "sandwich")
      for n in ("layernorm", "rmsnorm")
      for d in (2, 6, 12)
      for w in (0, 40)
  } < seen
  assert [x for x in seen if not x[-1]] == [("pre", "layernorm", 12, 40, False)]
  scaled = sweep.populations(scale=True)
  assert max(e["overrides"]["model.num_layers"] for e in scaled) > 12


def lesson_printout():
  """What the lesson's code prints, verbatim."""
  lines = ["pos  " + " ".join(f"{'d' + str(i):>5}" for i in range(8))]
  for pos in range(6):
    lines.append(f"{pos:3}  " + " ".join(f"{v:5.2f}" for v in lesson_positional_encoding(pos, 8)))
  lines.append("")
  here = lesson_positional_encoding(10, 16)
  for gap in [0, 1, 2, 4, 8, 16]:
    there = lesson_positional_encoding(10 + gap, 16)
    sim = sum(a * b for a, b in zip(here, there))
    lines.append(f"position 10 against position {10 + gap:2}: dot product {sim:5.2f}")
  return "\n".join(lines) + "\n"


def test_positions_script_equals_the_formula():
  positions = script("lesson_positions")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    positions.print_sinusoids()
  assert out.getvalue() == lesson_printout()
  rows = positions.sinusoid_rows(range(50), 16)
  np.testing.assert_allclose(
      rows, [lesson_positional_encoding(p, 16) for p in range(50)], atol=1e-6
  )
  here = lesson_positional_encoding(10, 16)
  expected = [
      sum(a * b for a, b in zip(here, lesson_positional_encoding(10 + g, 16)))
      for g in positions.GAPS
  ]
  np.testing.assert_allclose(positions.sinusoid_dots(), expected, atol=1e-5)
  ones = np.ones(16)
  for gap in positions.GAPS:
    # RoPE with q = k = ones: 2 x the sinusoid dot product, wherever the pair sits
    formula = 2 * sum(math.cos(gap * 10000 ** (-2 * i / 16)) for i in range(8))
    assert positions.rope_formula(gap) == pytest.approx(formula)
    assert positions.rope_formula(gap) == pytest.approx(2 * expected[positions.GAPS.index(gap)])
    for start in (0, 37, 1000):
      assert positions.rope_score(start + gap, start, ones, ones) == pytest.approx(
          formula, abs=2e-3
      )


def test_params_script_prints_the_lesson_counts():
  params = script("lesson_params")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    params.main()
  text = out.getvalue()
  for line in (
      "GPT-2 small  12 blocks, d =  768:   124,439,808 parameters",
      "GPT-2 XL     48 blocks, d = 1600: 1,557,611,200 parameters",
  ):
    assert line in text
  assert "DIFFERS" not in text and "differs" not in text
  assert text.count("174,604,259,328") == 2  # the formula and eval_shape of gpt3.py:175b


def test_attention_cost_grows_with_length(tmp_path):
  text = run_main(
      script("lesson_attention_cost"),
      "--min_len",
      "64",
      "--max_len",
      "256",
      "--d_model",
      "32",
      "--heads",
      "2",
      "--min_time",  # three timed calls per length: the timings are printed, not checked
      "0",
      "--out",
      str(tmp_path),
  )
  assert "   256 " in text
  rows = json.loads((tmp_path / "attention_cost.json").read_text())["rows"]
  assert [r["length"] for r in rows] == [64, 128, 256]
  assert [r["score_matrix_bytes"] for r in rows] == [2 * 4 * t * t for t in (64, 128, 256)]
  assert rows[-1]["temp_bytes"] >= rows[-1]["score_matrix_bytes"] > rows[0]["temp_bytes"]
  assert (tmp_path / "attention_cost.png").read_bytes()[:4] == b"\x89PNG"


def test_families_script_prints_one_line_per_family(tmp_path):
  text = run_main(
      script("lesson_families"),
      "vit",
      "--steps",
      "4",
      "--workdir",
      str(tmp_path),
      "--out",
      str(tmp_path),
  )
  lines = text.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("ViT") and "4 steps" in lines[0]
  assert "| ViT | vit.py:tiny | 102,218 |" in (tmp_path / "families.md").read_text()


def test_transformer_presets_peak_where_the_papers_schedule_does(experiment):
  for preset in ("base", "big"):
    config = experiment("transformer", preset)
    peak = config.model.d_model**-0.5 * config.warmup_steps**-0.5
    assert config.learning_rate == pytest.approx(peak, rel=1e-6), preset


@pytest.mark.parametrize(
    "override,needle",
    [
        ('{"model.norm_placment": "post"}', "'model.norm_placment', which is not a config field"),
        ('{"steps": "many"}', "steps='many'"),
    ],
)
def test_sweep_points_with_typos_or_wrong_types_stop_before_training(tmp_path, override, needle):
  lr = script("lr_sensitivity")
  sweep_file = tmp_path / "bad.py"
  sweep_file.write_text(
      TOY_SWEEP.replace('**{"model.norm_placement": "post",', f"**{override[:-1]},")
  )
  with pytest.raises(ValueError, match=re.escape(needle)):
    run_main(lr, "--sweep", str(sweep_file), "--out", str(tmp_path / "out"))
  assert not (tmp_path / "out" / "runs").exists()
  args = ("--sweep", str(sweep_file), "--out", str(tmp_path / "o"), "--max_populations", "-1")
  with pytest.raises(ValueError, match="--max_populations=-1"):
    run_main(lr, *args)


def test_compile_table_skips_rows_it_holds_and_keeps_the_rows_order(tmp_path):
  """plan_scale.py and moe_capacity.py share bench_report.compile_table: a second run compiles
  only what the first did not (or every selected row with redo), results in the rows' order."""
  from transformers_jax.scripting import bench_report

  rows = [{"name": "a"}, {"name": "b"}]
  markdown = lambda results: ",".join(f"{r['name']}{r['v']}" for r in results)
  compiled = []

  def compile_row(version):
    return lambda row: compiled.append(row["name"]) or {"name": row["name"], "v": version}

  args = (markdown, lambda result: "ok")
  assert bench_report.compile_table(rows, compile_row(1), tmp_path, ["b"], False, *args) == [
      {"name": "b", "v": 1}
  ]
  bench_report.compile_table(rows, compile_row(2), tmp_path, [], False, *args)
  assert compiled == ["b", "a"]
  assert (tmp_path / "tpu.md").read_text() == "a2,b1"
  bench_report.compile_table(rows, compile_row(3), tmp_path, ["a"], True, *args)
  assert (tmp_path / "tpu.md").read_text() == "a3,b1"
