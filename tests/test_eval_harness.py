"""The lm-eval harness on this project's models, on the local tasks of experiments/eval_tasks
(nothing downloaded): the adapter's log-likelihoods equal the model's own, one sequence at a
time (1e-5); lm-eval's accuracy is what those log-likelihoods choose; a population scores each
member during training and afterwards (evaluate), the same both times; bad requests are one
error line."""

import functools
import json
import sys

import jax
import numpy as np
import pytest

from conftest import ROOT
from transformers_jax.errors import UserError
from transformers_jax.evaluate import harness as harness_lib
from transformers_jax.evaluate.runs import evaluate_run
from transformers_jax.errors import RunError
from transformers_jax.machine import parallel
from transformers_jax.models import build_model
from transformers_jax.run_folder.runs import load_run
from transformers_jax.train.entry import train

TASKS_DIR = ROOT / "experiments" / "eval_tasks"
TASKS = "pysyntax_choice,pysyntax_complete,pystdlib_ppl"
LIMIT = 4  # examples per task: the harness's requests in a few batches


@pytest.fixture(scope="module")
def population_run(experiment, tmp_path_factory):
  """Two GPTs of one byte-level tiny shape (learning rates 1e-3 and 3e-2) trained 2 steps as one
  population, the harness run on each member at the last step."""
  config = experiment("gpt2", "tiny")
  config.unlock()
  config.model.update(num_layers=1, d_model=16, num_heads=2, max_len=32)
  config.update(dict(steps=2, batch_size=4, seq_len=16, warmup_steps=1, log_every=1, eval_every=0))
  config.update(dict(eval_batches=1, checkpoint_every=0, device_peak_flops=1e9))
  config.data.max_bytes = 50_000
  config.sample.max_new_tokens = 0
  config.population.learning_rates = "(1e-3, 3e-2)"
  config.eval_harness.update(
      every=2, tasks=TASKS, include_path=str(TASKS_DIR), limit=LIMIT, batch_size=4
  )
  workdir = tmp_path_factory.mktemp("harness_population")
  train(config, str(workdir))
  return workdir


def choice_requests() -> list[tuple[str, str, int, int]]:
  """(context, choice, question, choice index) of every choice of the local multiple-choice
  task, and two made-up requests longer than the model's 32 positions (their oldest tokens are
  dropped)."""
  out = []
  lines = (TASKS_DIR / "pysyntax_choice.jsonl").read_text().splitlines()
  for q, doc in enumerate(json.loads(line) for line in lines):
    out += [(doc["context"], choice, q, c) for c, choice in enumerate(doc["choices"])]
  long_context = "def process(self, items, *, timeout=None):\n    for item in item"
  return out + [(long_context, "s:", -1, 0), ("x = ", "[" + "1, " * 20 + "]", -1, 1)]


@functools.cache
def forward(model_cfg):
  """jit(params, tokens [1, max_len] -> logits): one program for every sequence."""
  return jax.jit(lambda p, x: build_model(model_cfg).apply({"params": p}, x)["logits"])


def direct_log_likelihood(model_cfg, params, tokens: list[int], n: int) -> tuple[float, bool]:
  """log P(last n tokens | the ones before) from the model's logits of this one sequence (its
  newest max_len + 1 tokens, of which the last n, or all but the first, are scored; the
  positions after it filled with zeros, which causal attention keeps from it), normalised and
  summed on the host in float64; and whether each scored token is the most likely there."""
  tokens = tokens[-(model_cfg.max_len + 1) :]
  n = min(n, len(tokens) - 1)
  inputs = np.zeros((1, model_cfg.max_len), np.int32)
  inputs[0, : len(tokens) - 1] = tokens[:-1]
  logits = np.asarray(forward(model_cfg)(params, inputs)[0], np.float64)
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  rows = np.arange(len(tokens) - 1 - n, len(tokens) - 1)
  targets = np.asarray(tokens[-n:])
  return float(logp[rows, targets].sum()), bool((logits[rows].argmax(-1) == targets).all())


def test_adapter_log_likelihoods_equal_the_models_own(population_run):
  from lm_eval.api.instance import Instance

  from transformers_jax.evaluate.adapter import JaxLM
  from transformers_jax.evaluate.scoring import Scorer

  model_cfg, params, tok, _ = load_run(population_run, member=0)
  mesh = parallel.make_mesh({"data": -1})
  lm = JaxLM(Scorer(model_cfg, params, mesh, batch_size=4), tok)
  requests = choice_requests()
  instances = [
      Instance("loglikelihood", {}, (context, choice), i)
      for i, (context, choice, _, _) in enumerate(requests)
  ]
  got = lm.loglikelihood(instances)
  for (context, choice, _, _), (logprob, greedy) in zip(requests, got):
    want, want_greedy = direct_log_likelihood(
        model_cfg, params, tok.encode(context + choice), len(tok.encode(choice))
    )
    assert logprob == pytest.approx(want, abs=1e-5, rel=1e-6), (context, choice)
    assert greedy == want_greedy
  # a document scored whole (rolling windows) is its tokens given the prefix token (a newline:
  # the byte tokenizer has no bos or eos)
  text = "import os\nprint(os.sep)\n"
  (rolled,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
  ids = tok.encode(text)
  want, _ = direct_log_likelihood(model_cfg, params, tok.encode("\n") + ids, len(ids))
  assert rolled == pytest.approx(want, abs=1e-5, rel=1e-6)
  # lm-eval's accuracy on the first LIMIT questions is what these log-likelihoods choose
  chosen = {}
  for (_, _, q, _), (logprob, _) in zip(requests, got):
    if 0 <= q < LIMIT:
      chosen.setdefault(q, []).append(logprob)
  answers = [
      json.loads(line)["answer"]
      for line in (TASKS_DIR / "pysyntax_choice.jsonl").read_text().splitlines()
  ]
  accuracy = np.mean([int(np.argmax(chosen[q]) == answers[q]) for q in range(LIMIT)])
  scored = json.loads((population_run / "eval_harness" / "step_2_member_0.json").read_text())
  assert scored["results"]["pysyntax_choice"]["acc,none"] == pytest.approx(accuracy)


def test_training_scores_each_member_and_evaluate_scores_them_again(population_run):
  lines = [json.loads(x) for x in (population_run / "metrics.jsonl").read_text().splitlines()]
  logged = {x["member"]: x for x in lines if "harness/pysyntax_choice/acc" in x}
  assert sorted(logged) == [0, 1] and all(x["step"] == 2 for x in logged.values())
  during = {}
  for member in (0, 1):
    path = harness_lib.results_path(population_run, 2, member)
    during[member] = json.loads(path.read_text())
    assert during[member]["step"] == 2 and during[member]["member"] == member
    assert set(during[member]["results"]) == set(TASKS.split(","))
    scores = harness_lib.metrics(during[member])
    assert {k: logged[member][k] for k in scores} == scores  # what metrics.jsonl holds
    assert "harness/pystdlib_ppl/bits_per_byte" in scores
    assert "harness/pysyntax_complete/exact_match" in scores
  # evaluate on the finished run: every member again, the same results (the same parameters)
  after = evaluate_run(population_run, {}, member=None)
  assert [member for member, _, _ in after] == [0, 1]
  for member, path, table in after:
    again = json.loads(path.read_text())
    assert again["results"] == during[member]["results"]
    assert "pysyntax_choice" in table
  # one member, and members that are not there
  (only,) = evaluate_run(population_run, {"tasks": "pysyntax_choice"}, member=1)
  assert only[0] == 1 and only[1].name == "step_2_member_1.json"
  with pytest.raises(RunError, match=r"--member=5: .* holds a population of 2 members"):
    evaluate_run(population_run, {"tasks": "pysyntax_choice"}, member=5)


def test_bad_requests_are_one_error_line(population_run, monkeypatch):
  with pytest.raises(UserError, match=r"include_path='nowhere': no such folder"):
    evaluate_run(population_run, {"include_path": "nowhere"}, member=0)
  monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if not installed
  with pytest.raises(
      UserError, match=r'needs lm-eval, which is not installed: pip install -e "\.\[eval\]"'
  ):
    evaluate_run(population_run, {}, member=0)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"eval_harness.every": -1}, r"eval_harness.every=-1: must be >= 0"),
        ({"eval_harness.every": 5}, r"eval_harness.tasks is empty: name lm-eval tasks"),
        ({"eval_harness.batch_size": 0}, r"eval_harness.batch_size=0: give a positive number"),
        ({"eval_harness.num_fewshot": -2}, r"eval_harness.num_fewshot=-2: give a number"),
        ({"wandb.mode": "ofline"}, r"wandb.mode='ofline': choose online, offline"),
    ],
)
def test_settings_that_cannot_work_are_refused_before_training(experiment, fields, message):
  from transformers_jax.config import ModelConfig
  from transformers_jax.train.field_checks import check_tracking

  config = experiment("gpt2", "tiny")
  config.unlock()
  config.update_from_flattened_dict(fields)
  with pytest.raises(ValueError, match=message):
    check_tracking(config, ModelConfig.from_dict(config.model))
  bert = experiment("bert", "tiny")
  bert.unlock()
  bert.update_from_flattened_dict({"eval_harness.every": 5, "eval_harness.tasks": "x"})
  with pytest.raises(
      ValueError, match=r"scores decoder-only language models, not model.family=encoder"
  ):
    check_tracking(bert, ModelConfig.from_dict(bert.model))
