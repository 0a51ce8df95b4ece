"""Experiment trackers behind the metrics writer (train/metrics.py): Weights & Biases.

`--config.wandb.project=P` sends every metrics.jsonl line to a W&B run (process 0 alone), with
the resolved config and the run's files (config.json, run.json, run_history.jsonl, and
metrics.jsonl at the end). The run's id is kept in WORKDIR/wandb_run.json, so running the same
command again (a resume) continues the same W&B run, online or offline.

Each line is logged at its training step (`wandb.log(row, step=step)`), so W&B's step is the
training step, and the lines of one step (the training line and the evaluation line; each
population member's) make one W&B history row. Numbers keep metrics.jsonl's keys; per-layer
values are named as in TensorBoard (residual_rms/decoder/layer_0); a population's members log
into the one run, each under `member_<i>/` (as in TensorBoard), with the member table in the
run's config: one id to resume, one place to compare members (docs/tracking.md says why).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from transformers_jax.errors import Interrupted, UserError
from transformers_jax.run_folder import records
from transformers_jax.train.metrics import MetricsWriter, scalars

RUN_RECORD = "wandb_run.json"  # in the workdir: the W&B run this workdir logs to


def wanted(config) -> bool:
  """Whether the config asks for W&B logging."""
  group = config.get("wandb")
  return bool(group is not None and group.get("project"))


def import_wandb():
  """The wandb module, or one error line saying which extra installs it."""
  try:
    import wandb
  except ImportError:
    raise UserError(
        "--config.wandb.project is set but the wandb package is not installed: "
        'pip install -e ".[wandb]" (or leave wandb.project empty)'
    ) from None
  return wandb


def check(config) -> None:
  """Before anything is built: wandb is installed when the config logs to W&B (train_config's
  validate checks the fields)."""
  if wanted(config):
    import_wandb()


def open_writer(config, workdir, enabled: bool, members=None) -> MetricsWriter:
  """The run's metrics writer: metrics.jsonl and TensorBoard, and W&B when the config asks for
  it (`enabled`: this is process 0; `members`: a population's member table)."""
  trackers = [WandbTracker(config, workdir, members)] if enabled and wanted(config) else []
  return MetricsWriter(workdir, enabled=enabled, trackers=trackers)


def saved_run(workdir) -> dict | None:
  """WORKDIR/wandb_run.json (id, project, entity, url of the workdir's W&B run), or None."""
  path = pathlib.Path(workdir) / RUN_RECORD
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


class WandbTracker:
  """One W&B run per workdir: started (or resumed, by the id WORKDIR/wandb_run.json keeps) with
  the resolved config; write() logs a metrics line at its step; close() finishes the run."""

  def __init__(self, config, workdir, members=None):
    wandb = import_wandb()
    self.workdir = pathlib.Path(workdir)
    fields = config.wandb
    saved = saved_run(self.workdir) or {}
    run_id = saved.get("id")  # None: W&B makes one, recorded once the run has started
    resolved = json.loads(config.to_json_best_effort())
    if members is not None:
      resolved["population_members"] = [dict(m) for m in members]
    tags = [t.strip() for t in fields.tags.split(",") if t.strip()]
    self.run = wandb.init(
        project=fields.project,
        entity=fields.entity or None,
        name=fields.name or self.workdir.resolve().name,
        group=fields.group or None,
        tags=tags or None,
        notes=fields.notes or None,
        mode=fields.mode or None,
        id=run_id,
        resume="allow" if run_id else None,  # (offline, W&B says it starts the id anew)
        dir=os.environ.get("WANDB_DIR") or str(self.workdir),
        config=resolved,
    )
    self._record(
        {
            "id": self.run.id,
            "project": fields.project,
            "entity": fields.entity or None,
            "url": getattr(self.run, "url", None),
        }
    )
    for name in ("config.json", "run.json", "run_history.jsonl"):
      self._save(name, "live")

  def _record(self, fields: dict) -> None:
    records.write_text_atomically(
        self.workdir / RUN_RECORD, json.dumps(fields, indent=1, sort_keys=True) + "\n"
    )

  def _save(self, name: str, policy: str) -> None:
    if (self.workdir / name).is_file():
      self.run.save(str(self.workdir / name), base_path=str(self.workdir), policy=policy)

  def write(self, step: int, values: dict, prefix: str = "") -> None:
    self.run.log(dict(scalars(values, prefix)), step=step)

  def close(self) -> None:
    for name in ("metrics.jsonl", "run_history.jsonl"):
      self._save(name, "end")
    failure = sys.exc_info()[1]  # close() runs in the training loop's `finally`
    if isinstance(failure, Interrupted):  # saved and stopped: the next invocation continues
      self.run.mark_preempting()
    self.run.finish(exit_code=0 if failure is None else 1)
