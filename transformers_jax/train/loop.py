"""The solo training loop: data, sharded state, jit step, evaluation, checkpoints, metrics,
resume. Its entry is entry.train, which chooses it for a config without population settings."""

from __future__ import annotations

import math
import time

import jax

from transformers_jax.machine import parallel
from transformers_jax.models import counting, flops
from transformers_jax.modules import parametrization, quantization
from transformers_jax.errors import UserError
from transformers_jax.evaluate import harness as harness_lib
from transformers_jax.run_folder.runs import Run
from transformers_jax.train import evaluation
from transformers_jax.train import metrics as metrics_lib
from transformers_jax.train.events import (
    Pace,
    Progress,
    StepProfiler,
    run_steps,
    stop_if_not_finite,
)
from transformers_jax.train.preemption import StopRequests
from transformers_jax.train.setup import Setup, open_run


def _eval_metrics(setup, data, eval_step, params) -> dict:
  mesh = setup.mesh
  batches = (parallel.put_batch(_local(b, mesh), mesh) for b in data.eval_batches)
  totals, inter = evaluation.evaluate_batches(eval_step, params, batches)
  decodes = evaluation.task_overrides(setup.task, "eval_metrics")
  # decoding reads whole parameters on every process
  whole = parallel.gather_to_host(setup.device_params(params)) if decodes else None
  return evaluation.summarize(setup.task, data, totals, inter, whole, setup.model_cfg)


def _local(batch: dict, mesh) -> dict:
  """This process's rows of a global batch."""
  if jax.process_count() == 1:
    return batch
  start, stop = parallel.process_rows(mesh, len(next(iter(batch.values()))))
  return {k: v[start:stop] for k, v in batch.items()}


def _check_stream_rows(mesh, batch_size: int) -> None:
  """A streaming pipeline cuts this process's rows by process index (contiguous blocks, as
  np.array_split): the mesh must feed this process's devices the same rows."""
  from transformers_jax.data.pipeline import local_rows

  rows = local_rows(batch_size, jax.process_index(), jax.process_count())
  if parallel.process_rows(mesh, batch_size) != (rows.start, rows.stop):
    raise UserError(
        f"mesh {dict(mesh.shape)}: process {jax.process_index()} feeds rows "
        f"{parallel.process_rows(mesh, batch_size)} of the batch, but the input pipeline reads "
        f"rows [{rows.start}, {rows.stop}): order the mesh so that process i's devices hold the "
        "i-th block of the batch (the default mesh does)"
    )


def process_batch(data, step: int, mesh, batch_size: int) -> dict:
  """The rows of step `step`'s global batch that this process feeds, built without the rest
  where the task can (TaskData.train_rows)."""
  start, stop = parallel.process_rows(mesh, batch_size)
  return data.rows(step, start, stop)


def train_solo(setup: Setup, run: Run, allow_data_change: bool) -> dict:
  """Train (or resume) the one model of `setup` in `run` (locked by entry.train); returns the
  final metrics."""
  config, model_cfg, mesh, task = setup.config, setup.model_cfg, setup.mesh, setup.task
  workdir = run.path
  is_main = jax.process_index() == 0
  opened = open_run(setup, run, allow_data_change)
  data, checkpoints, state, start = opened.data, opened.checkpoints, opened.state, opened.start
  note, harness, writer = opened.note, opened.harness, opened.writer
  train_step, eval_step = opened.train_step, opened.eval_step
  peak, peak_source = metrics_lib.device_peak(per_device_override=config.device_peak_flops)
  tokens_per_example = task.tokens_per_example(model_cfg, config)
  tokens_per_step = config.batch_size * tokens_per_example
  flops_per_step = flops.flops_per_token(model_cfg, tokens_per_example) * tokens_per_step
  if is_main:
    trained = ""
    if model_cfg.lora_rank:  # models/lora.py: only the adapters train
      adapters = counting.lora_count(model_cfg)
      trained = (
          f" ({adapters:,} trained: LoRA rank {model_cfg.lora_rank} on "
          f"{model_cfg.lora_targets}"
          + (
              f" and {model_cfg.lora_modules_to_save} in full"
              if model_cfg.lora_modules_to_save
              else ""
          )
          + ", the rest frozen)"
      )
    print(
        f"{model_cfg.family} model, {parametrization.describe(model_cfg)}"
        f"{quantization.describe(model_cfg)}, "
        f"{counting.count(model_cfg, setup.abstract.params):,} parameters{trained}; "
        f"{data.summary}"
    )
    print(
        f"mesh {dict(mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} "
        f"devices; {note}; MFU peak: {peak_source}",
        flush=True,
    )
  progress = Progress(start, config.steps, enabled=is_main)
  end = min(config.stop_after or config.steps, config.steps)
  pace = Pace(start, end, config.steps)
  if data.train_stream:
    _check_stream_rows(mesh, config.batch_size)
  stream = data.train_stream(start, end) if data.train_stream else None
  # the loop's own variables: the last checkpoint, the step whose finiteness is unchecked (the
  # throughput clock, `pace`, starts after the first step: compilation is not throughput)
  at = {"saved": start, "pending": None}
  result: dict = {}

  def next_batch(step):
    rows = (
        next(stream) if stream is not None else process_batch(data, step, mesh, config.batch_size)
    )
    return parallel.put_batch(rows, mesh), rows

  def on_step(done, state, metrics, rows, log_now, eval_now, save_now):
    # check the previous step while this one runs: a non-finite loss stops the run
    if at["pending"] is not None:
      stop_if_not_finite(at["pending"], checkpoints, at["saved"])
    if done == start + 1:
      jax.block_until_ready(metrics)
      pace.first_step_done(done)
    at["pending"] = (done, metrics, rows)
    if log_now or eval_now or save_now:
      values = {k: float(v) for k, v in jax.device_get(metrics).items()}
      stop_if_not_finite(at["pending"], checkpoints, at["saved"], values)
      at["pending"] = None
    if log_now:
      steps_per_s = pace.lap(done)  # None at the first step: nothing timed yet
      if steps_per_s is not None:
        values["tokens_per_s"] = steps_per_s * tokens_per_step
        values["mfu"] = steps_per_s * flops_per_step / peak if peak else None
      if task.language_model and "nll" in values:
        values["perplexity"] = math.exp(min(values["nll"], 50.0))
      if data.step_metrics is not None:  # a mixture's tokens seen per source
        values.update(data.step_metrics(done))
      writer.write(done, values)
      progress.update(done, values, pace.describe(done, steps_per_s))
      result.update(values)
    if eval_now:
      began = time.perf_counter()
      ev = _eval_metrics(setup, data, eval_step, state.params)
      writer.write(done, ev)
      progress.note(done, ev)
      result.update(ev)
      pace.leave_out(began)  # evaluation time is not training throughput
    if harness is not None and harness_lib.due(config, done):
      began = time.perf_counter()
      scores = harness(done, setup.device_params(state.params))
      writer.write(done, scores)
      progress.say(f"step {done}/{config.steps}: harness {harness_lib.describe(scores)}")
      result.update(scores)
      pace.leave_out(began)
    if save_now:
      at["saved"] = done

  state = run_steps(
      config,
      state,
      start,
      end,
      train_step=train_step,
      next_batch=next_batch,
      checkpoints=checkpoints,
      stop_requests=StopRequests(abort_before_start=True),
      profiler=StepProfiler(config.profile.start_step, config.profile.num_steps, workdir / "tb"),
      on_step=on_step,
      cleanup=[getattr(stream, "close", lambda: None), progress.close, writer.close],
  )
  checkpoints.close()
  result["step"] = max(start, end)
  sample = None
  if config.sample.max_new_tokens and evaluation.task_overrides(task, "sample"):
    # every process takes part in the gather (of device copies where host_offload keeps them)
    params = parallel.gather_to_host(setup.device_params(state.params))
    if is_main:
      sample = task.sample(data, model_cfg, params, config)
  if is_main:
    if sample is not None:
      (workdir / "sample.txt").write_text(sample)
      print("\n--- sample ---\n" + sample + "\n--------------")
    print(
        f"run files: {workdir} (config.json, metrics.jsonl, tb/, checkpoints/"
        f"{', sample.txt' if sample is not None else ''})"
    )
    result["sample"] = sample
  return result
