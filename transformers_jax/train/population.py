"""Population training: many models trained as one program, each member the solo run of its
seed and hyperparameters (who the members are, their state and the vmapped step: members.py).

The driver is the solo loop's (events.run_steps) with the population's feed and logging: each
seed's batch stream, as its solo run sees it (the streaming pipeline and packing included),
stacked into [members, batch, ...]; metrics.jsonl gets one line per member per logged step,
with `member`, its hyperparameters and `diverged`; TensorBoard the same values under
`member_<i>/`. Evaluation runs every member on the first seed's held-out batches. Checkpoints
hold every member (and the hyperparameters, checked on resume); generate, convert and
init_from take one member of them (--member, --config.init_member).
"""

from __future__ import annotations

import math
import time

import jax
import numpy as np

from transformers_jax.evaluate import harness as harness_lib
from transformers_jax.machine import parallel
from transformers_jax.modules import parametrization, quantization
from transformers_jax.run_folder.runs import Run
from transformers_jax.train import evaluation
from transformers_jax.train.events import Pace, StepProfiler, run_steps
from transformers_jax.train.members import LISTS, describe, list_values, member, put_stacked
from transformers_jax.train.preemption import StopRequests
from transformers_jax.train.setup import open_run


class MemberBatches:
  """step -> the members' batches of that step, [M, B, ...] split as the setup says, each
  member's rows from its seed's data: the streaming pipeline's batches in one process, else
  just the rows this process's devices hold."""

  def __init__(self, setup, datas: dict, start: int, end: int):
    self.setup, self.datas = setup, datas
    self.seed_of = [m["seed"] for m in setup.members]
    self.shapes = {
        k: ((setup.member_count, *shape), dtype)
        for k, (shape, dtype) in setup.task.batch_shapes(setup.model_cfg, setup.config).items()
    }
    one_process = jax.process_count() == 1  # (several: each builds the rows it holds)
    self.streams = {
        seed: data.train_stream(start, end)
        for seed, data in datas.items()
        if one_process and data.train_stream
    }

  def __call__(self, step: int):
    sharding = self.setup.batch_sharding()
    if jax.process_count() == 1:  # the whole stacked batch, placed in one transfer
      if self.streams:
        whole = {seed: next(stream) for seed, stream in self.streams.items()}
      else:
        whole = {seed: data.train_batch(step) for seed, data in self.datas.items()}
      stacked = {k: np.stack([whole[s][k] for s in self.seed_of]) for k in self.shapes}
      return jax.device_put(stacked, sharding), None
    rows_of = lambda m, a, b: self.datas[self.seed_of[m]].rows(step, a, b)  # noqa: E731
    return put_stacked(rows_of, self.shapes, sharding), None

  def close(self):
    for stream in self.streams.values():
      getattr(stream, "close", lambda: None)()


def _on_host(tree):
  """A tree of per-member arrays as numpy, on every process (all of them must call it): the
  members of another process's devices too."""
  return jax.device_get(parallel.gather_to_host(tree))


def train_population(setup, run: Run, allow_data_change: bool = False) -> dict:
  """Train (or resume) the population of `setup` in `run`: train()'s run folder, checkpoints
  and metrics, one line per member. Returns {"members": [final metrics per member], "step",
  "member_devices": how many devices the members are split over}."""
  config, table, workdir = setup.config, setup.members, run.path
  count, is_main = len(table), jax.process_index() == 0
  opened = open_run(setup, run, allow_data_change)  # each seed's data, as its solo run's
  datas, data, checkpoints, state = opened.datas, opened.data, opened.checkpoints, opened.state
  start, harness, writer = opened.start, opened.harness, opened.writer
  split = setup.mesh.shape["data"] if setup.member_axis else 1
  layout = {a: n for a, n in setup.mesh.shape.items() if n > 1 and a != setup.member_axis}
  if is_main:
    print(
        f"population of {count} {setup.model_cfg.family} models, "
        f"{parametrization.describe(setup.model_cfg)}{quantization.describe(setup.model_cfg)}"
        f" ({len(datas)} seeds x "
        + " x ".join(f"{len(list_values(config, n))} {LISTS[n]}" for n in LISTS)
        + f"), split over {split} device(s)"
        + (f", each member over mesh axes {layout}" if layout else "")
        + f"; {data.summary}; {opened.note}",
        flush=True,
    )
  results = [dict(m) for m in table]
  # (members split over the data axis may live on other processes: gather them, every process)
  reported = set(int(i) for i in np.flatnonzero(~np.asarray(_on_host(state.alive))))
  end = min(config.stop_after or config.steps, config.steps)
  feed = MemberBatches(setup, datas, start, end)
  eval_batches = [_shared(b, setup.eval_batch_sharding()) for b in data.eval_batches]
  pace = Pace(start, end, config.steps)  # its clock starts after the first step (compilation)

  def on_step(done, state, metrics, rows, log_now, eval_now, save_now):
    if done == start + 1:
      jax.block_until_ready(metrics)
      pace.first_step_done(done)
    if log_now:
      values = _on_host(metrics)
      alive, diverged_at = _on_host((state.alive, state.diverged_at))
      # a mixture's tokens seen per source: the same rows for every member
      seen = data.step_metrics(done) if data.step_metrics is not None else {}
      for i, m in enumerate(table):
        line = {**m, **{k: float(v[i]) for k, v in values.items()}, **seen}
        line["diverged"] = not bool(alive[i])
        if line["diverged"]:
          line["diverged_at"] = int(diverged_at[i])
        writer.write(done, line, tb_prefix=f"member_{i:03d}/")
        results[i].update(line)
      for i in np.flatnonzero(~alive):
        if int(i) not in reported and is_main:
          print(
              f"member {i} ({describe(table[i])}) diverged at step {diverged_at[i]}: "
              "its state is frozen there; the others carry on",
              flush=True,
          )
        reported.add(int(i))
      finite = {i: float(values["loss"][i]) for i in range(count) if alive[i]}
      best = min(finite, key=finite.get) if finite else None
      steps_per_s = pace.lap(done)
      if is_main:
        print(
            f"step {done}/{config.steps}: {int(alive.sum())}/{count} members training, best loss "
            + (
                f"{finite[best]:.4f} (member {best}: {describe(table[best])})"
                if best is not None
                else "nan"
            )
            + f" | {pace.describe(done, steps_per_s)}",
            flush=True,
        )
    if eval_now:
      began = time.perf_counter()
      evals = _evaluate(setup, data, opened.eval_step, state.params, eval_batches)
      for i, ev in enumerate(evals):
        writer.write(done, {**table[i], **ev}, tb_prefix=f"member_{i:03d}/")
        results[i].update(ev)
      if is_main:
        print(f"step {done}/{config.steps}: eval {best_member(evals, table)}", flush=True)
      pace.leave_out(began)  # evaluation time is not training throughput
    if harness is not None and harness_lib.due(config, done):
      began = time.perf_counter()
      whole = parallel.gather_to_host(state.params)  # each member scored on the whole mesh
      for i in range(count):
        scores = harness(done, member(whole, i), member=i)
        writer.write(done, {**table[i], **scores}, tb_prefix=f"member_{i:03d}/")
        results[i].update(scores)
        if is_main:
          print(f"step {done}/{config.steps}: member {i} harness {harness_lib.describe(scores)}")
      pace.leave_out(began)

  run_steps(
      config,
      state,
      start,
      end,
      train_step=opened.train_step,
      next_batch=feed,
      checkpoints=checkpoints,
      stop_requests=StopRequests(abort_before_start=True),
      profiler=StepProfiler(config.profile.start_step, config.profile.num_steps, workdir / "tb"),
      on_step=on_step,
      cleanup=[feed.close, writer.close],
  )
  checkpoints.close()
  if is_main:
    print(
        f"run files: {workdir} (config.json, metrics.jsonl with one line per member, tb/, "
        "checkpoints/)"
    )
  return {"members": results, "step": max(start, end), "member_devices": split}


def best_member(evals: list[dict], table: list[dict]) -> str:
  """Which member has the lowest held-out loss, with its figures (and its greedy exact match
  and BLEU where the task decodes)."""
  finite = [i for i, ev in enumerate(evals) if math.isfinite(ev["eval_loss"])]
  if not finite:
    return "no member has a finite loss"
  i = min(finite, key=lambda i: evals[i]["eval_loss"])
  ev = evals[i]
  text = f"best loss {ev['eval_loss']:.4f} acc {ev['eval_accuracy']:.3f}"
  if "eval_exact_match" in ev:
    text += f" (greedy exact match {ev['eval_exact_match']:.3f} BLEU {ev['eval_bleu']:.1f})"
  return text + f" by member {i}: {describe(table[i])}"


def _shared(batch: dict, sharding) -> dict:
  """A held-out batch (whole on every process) as global arrays split as `sharding` says."""
  return {
      k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
      for k, v in batch.items()
  }


def _evaluate(setup, data, eval_step, params, batches) -> list[dict]:
  """Held-out metrics per member, reduced as a solo run's (evaluation.summarize)."""
  totals, inter = evaluation.evaluate_batches(eval_step, params, batches)
  decodes = evaluation.task_overrides(setup.task, "eval_metrics")
  whole = parallel.gather_to_host(params) if decodes else None  # decoding reads whole members
  return [
      evaluation.summarize(
          setup.task,
          data,
          member(totals, i),
          member(inter, i),
          None if whole is None else member(whole, i),
          setup.model_cfg,
      )
      for i in range(setup.member_count)
  ]
