"""The training loop: data, sharded state, jit step, evaluation, checkpoints, metrics, resume."""

from __future__ import annotations

import math
import sys
import time

import jax
import numpy as np

from transformers_jax import counting, parallel, runs
from transformers_jax.errors import UserError
from transformers_jax.runs import PARAMS_ONLY, Run
from transformers_jax.config import ModelConfig
from transformers_jax.train import metrics as metrics_lib
from transformers_jax.train import resume
from transformers_jax.train.events import (  # noqa: F401  (TrainingDiverged: the loop's error)
    Progress,
    TrainingDiverged,
    step_events,
    stop_if_not_finite,
)
from transformers_jax.train_config import validate
from transformers_jax.train.optim import make_optimizer, schedule
from transformers_jax.train.preemption import StopRequests
from transformers_jax.train.profiling import StepProfiler
from transformers_jax.train.step import (
    abstract_state,
    attention_logit_max,
    create_state,
    make_eval_step,
    make_train_step,
    moe_dropped_fraction,
    residual_rms,
)
from transformers_jax.tasks import task_data, task_for


def _decodes(task, hook: str) -> bool:
  """Whether the task overrides a decoding hook of the base Task (eval_metrics, sample)."""
  from transformers_jax.tasks import Task

  return getattr(type(task), hook) is not getattr(Task, hook)


def _eval_metrics(task, data, eval_step, params, mesh, model_cfg) -> dict:
  totals, rms, dropped, logit_max = None, None, None, None
  for batch in data.eval_batches:
    sums, inter = eval_step(params, parallel.put_batch(_local(batch, mesh), mesh))
    sums = jax.device_get(sums)
    totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
    if rms is None:
      rms, dropped = residual_rms(inter), moe_dropped_fraction(inter)
      logit_max = attention_logit_max(inter)
  w = max(float(totals["weight"]), 1.0)
  out = {"eval_loss": float(totals["loss"]) / w, "eval_accuracy": float(totals["correct"]) / w}
  if task.language_model:
    out["eval_perplexity"] = math.exp(min(out["eval_loss"], 50.0))
  if data.eval_bytes:  # nats per target token -> bits per byte of the text they stand for
    out["eval_bits_per_byte"] = float(totals["nll"]) / math.log(2) / data.eval_bytes
  if _decodes(task, "eval_metrics"):  # decoding reads whole parameters on every process
    out.update(task.eval_metrics(data, model_cfg, parallel.gather_to_host(params)))
  if dropped is not None:  # MoE: routing choices over expert capacity (first held-out batch)
    out["eval_moe_dropped_fraction"] = dropped
  out["residual_rms"] = rms
  if logit_max:  # largest attention logit per block (first held-out batch)
    out["attention_logit_max"] = logit_max
  return out


def _local(batch: dict, mesh=None) -> dict:
  """This process's rows of a global batch."""
  if jax.process_count() == 1:
    return batch
  if mesh is None:
    n, i = jax.process_count(), jax.process_index()
    return {k: np.array_split(v, n)[i] for k, v in batch.items()}
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


def train(config, workdir: str, task=None, allow_data_change: bool = False) -> dict:
  """Train (or resume) the run in `workdir`; returns the final metrics. The objective is the
  model's (tasks.task_for) unless a Task is given. A config with `population` settings trains
  its members as one program (train/population.py). One run per workdir: a second one stops
  with an error naming the first."""
  run = Run(workdir)
  is_main = jax.process_index() == 0
  lock = runs.WorkdirLock(run.path)
  problem = None
  if is_main:
    try:
      lock_note = lock.acquire()
      if lock_note:
        print(lock_note, flush=True)
    except (runs.WorkdirBusy, OSError) as e:  # busy; or a workdir that cannot be made
      problem = e
  if not parallel.agree(problem is None):
    raise problem or UserError(f"process 0 could not lock {run.path}: see its error")
  # until the first step, Ctrl-C or SIGTERM ends the run at once: nothing is lost
  stop_requests = StopRequests(abort_before_start=True)
  try:
    from transformers_jax.train import population

    if population.enabled(config):
      return population.train_population(config, str(run.path), task)
    return _train(config, run, task, allow_data_change, stop_requests)
  finally:
    stop_requests.restore()
    lock.release()


def _train(config, run: Run, task, allow_data_change: bool, stop_requests=None) -> dict:
  workdir = run.path
  model_cfg = ModelConfig.from_dict(config.model)
  mesh = parallel.make_mesh(config.mesh.to_dict())
  rule_table = parallel.rules(config.rules.to_dict())
  validate(config, model_cfg, mesh.shape["data"] * mesh.shape["fsdp"])
  is_main = jax.process_index() == 0
  workdir.mkdir(parents=True, exist_ok=True)
  resume.check_same_model(run, config)
  # a new run, or one that starts from parameters alone (a converted model): config.json
  # describes it from here on; otherwise a resume, whose changed settings are recorded
  new_run = run.latest_step() is None or run.starts_from_parameters()
  changes = {} if new_run else resume.check_resumed_settings(run, config, allow_data_change)

  task = task or task_for(model_cfg)
  data = task_data(task, config, model_cfg, workdir)
  if not new_run:  # the files at data.path changed since the last invocation read them
    changes.update(runs.data_source_changes(run, data.source, allow_data_change))
  if is_main:
    if new_run:
      run.write_config(config)
    runs.write_run_info(workdir, sys.argv, data_source=data.source)
  tx = make_optimizer(config)
  state, shardings = create_state(model_cfg, tx, mesh, rule_table, config.seed)
  checkpoints = run.checkpoints(config.keep_checkpoints)
  start = checkpoints.latest_step()
  if start is not None and checkpoints.kind(start) == PARAMS_ONLY:  # e.g. a converted model
    target = {"params": abstract_state(state, shardings).params}
    state = state.replace(params=checkpoints.restore(start, target)["params"])
    note = f"started from the parameters-only checkpoint at step {start} (fresh optimizer)"
  elif start is not None:
    state, start = resume.restore_verified(
        checkpoints,
        abstract_state(state, shardings),
        resume.non_finite,
        does_not_fit="does not fit this run's state ({error}): resume with the optimizer "
        "settings it was saved with (grad_clip, weight_decay …) or use a new --workdir",
    )
    note = f"resumed from step {start}"
    if changes:
      if is_main:
        said = ", ".join(f"{f}: {a!r} -> {b!r}" for f, (a, b) in changes.items())
        print(f"resumed with changed settings ({said}): recorded in run_history.jsonl", flush=True)
        run.record_changes(start, changes, sys.argv)
  elif config.init_from:
    params, loaded, fresh, src_step = resume.init_from_run(config.init_from, state.params)
    state = state.replace(params=params)
    note = (
        f"initialised {len(loaded)} tensors from {config.init_from} (step {src_step}); "
        f"{len(fresh)} new: {', '.join(sorted({f.split('/')[0] for f in fresh})) or '-'}"
    )
    start = 0
  else:
    note, start = "fresh start", 0

  train_step = make_train_step(
      task, model_cfg, config, tx, schedule(config), mesh, rule_table, shardings
  )
  eval_step = make_eval_step(task, model_cfg, mesh, rule_table, shardings)
  writer = metrics_lib.MetricsWriter(workdir, enabled=is_main)
  peak, peak_source = metrics_lib.device_peak(per_device_override=config.device_peak_flops)
  tokens_per_example = task.tokens_per_example(model_cfg, config)
  tokens_per_step = config.batch_size * tokens_per_example
  flops_per_step = counting.flops_per_token(model_cfg, tokens_per_example) * tokens_per_step
  params_count = counting.count(model_cfg)
  if is_main:
    print(f"{model_cfg.family} model, {params_count:,} parameters; {data.summary}")
    print(
        f"mesh {dict(mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} "
        f"devices; {note}; MFU peak: {peak_source}",
        flush=True,
    )

  stop_requests = stop_requests or StopRequests()
  profiler = StepProfiler(config.profile.start_step, config.profile.num_steps, workdir / "tb")
  progress = Progress(start, config.steps, enabled=is_main)
  last_saved = start
  pending, t_last, step_last = None, time.perf_counter(), start
  result: dict = {}
  stream = None
  try:
    end = min(config.stop_after or config.steps, config.steps)
    stream = data.train_stream(start, end) if data.train_stream else None
    if stream is not None:
      _check_stream_rows(mesh, config.batch_size)
    for step in range(start, end):
      if stream is not None:
        rows = next(stream)
      else:
        rows = process_batch(data, step, mesh, config.batch_size)
      with profiler.step(step, wait_for=state):
        batch = parallel.put_batch(rows, mesh)
        state, metrics = train_step(state, batch)
      # check the previous step while this one runs: a non-finite loss stops the run
      if pending is not None:
        stop_if_not_finite(pending, checkpoints, last_saved)
      done = step + 1
      if step == start:  # throughput excludes compilation
        jax.block_until_ready(metrics)
        t_last, step_last = time.perf_counter(), done
        stop_requests.started()  # from here a signal saves at a step boundary
      pending = (done, metrics, rows)
      stop_now = stop_requests.stop_at(done)
      log_now, eval_now, save_now = step_events(config, done, end, stop_now)
      if log_now or eval_now or save_now:
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        stop_if_not_finite(pending, checkpoints, last_saved, values)
        pending = None
      if log_now:
        now = time.perf_counter()
        rate = (done - step_last) * tokens_per_step / max(now - t_last, 1e-9)
        values["tokens_per_s"] = rate
        values["mfu"] = rate / tokens_per_step * flops_per_step / peak if peak else None
        if task.language_model:
          values["perplexity"] = math.exp(min(values["nll"], 50.0))
        writer.write(done, values)
        progress.update(done, values)
        t_last, step_last = now, done
        result.update(values)
      if eval_now:
        ev = _eval_metrics(task, data, eval_step, state.params, mesh, model_cfg)
        writer.write(done, ev)
        progress.note(done, ev)
        result.update(ev)
        t_last = time.perf_counter()  # evaluation time is not training throughput
      if save_now:
        checkpoints.save(done, state)
        last_saved = done
      if stop_now:
        profiler.stop(state)
        checkpoints.close()
        raise UserError(
            f"interrupted ({stop_requests.signal_name or 'signal'}): saved step {done} in "
            f"{checkpoints.directory}; run the same command again to resume"
        )
  finally:
    if stream is not None and hasattr(stream, "close"):  # stops the pipeline's workers
      stream.close()
    stop_requests.restore()
    profiler.stop()
    progress.close()
    writer.close()
  checkpoints.close()
  result["step"] = max(start, end)
  sample = None
  if config.sample.max_new_tokens and _decodes(task, "sample"):
    params = parallel.gather_to_host(state.params)  # every process takes part in the gather
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
