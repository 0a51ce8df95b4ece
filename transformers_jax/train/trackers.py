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
import re
import sys

from transformers_jax.errors import Interrupted, UserError
from transformers_jax import records
from transformers_jax.train.metrics import MetricsWriter, scalars

RUN_RECORD = "wandb_run.json"  # in the workdir: the W&B run this workdir logs to

# W&B's own limits (wandb.sdk.wandb_settings: validate_project, validate_run_tags), checked
# before anything is built rather than met as wandb's UsageError at the first step.
PROJECT_FORBIDDEN = "/\\#?%:"
PROJECT_MAX_LEN = 128
TAG_MAX_LEN = 64
MODES = ("online", "offline", "disabled")


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


def _fields(config) -> dict:
  """The config's wandb.* fields as a dict ({} for a config without the group)."""
  group = config.get("wandb")
  if group is None:
    return {}
  return group.to_dict() if hasattr(group, "to_dict") else dict(group)


def check_unread(config) -> None:
  """No wandb.* field is set without wandb.project, which alone turns W&B logging on: such a
  field would be ignored. A ValueError naming the field and the fix."""
  fields = _fields(config)
  if fields.get("project"):
    return
  for name, value in sorted(fields.items()):
    if name != "project" and value:
      raise ValueError(
          f"wandb.{name}={value!r}: read only with wandb.project set: add "
          f"--config.wandb.project=NAME to log to W&B, or leave wandb.{name} empty"
      )


def check_fields(config) -> None:
  """The wandb.* fields W&B would refuse at its first call: a ValueError naming the field and
  the fix."""
  fields = _fields(config)
  mode = fields.get("mode", "")
  if mode not in ("", *MODES):
    raise ValueError(
        f"wandb.mode={mode!r}: choose online, offline (no network; `wandb sync` uploads the run "
        "later) or disabled, or '' for $WANDB_MODE"
    )
  project = fields.get("project", "")
  if not project:
    return
  found = "".join(c for c in PROJECT_FORBIDDEN if c in project)
  if found:
    raise ValueError(
        f"wandb.project={project!r}: a W&B project name cannot contain any of "
        f"{' '.join(PROJECT_FORBIDDEN)} (found {' '.join(found)}): use e.g. "
        f"{re.sub('[' + re.escape(PROJECT_FORBIDDEN) + ']', '-', project)!r} (the team or user "
        "that owns the project goes in wandb.entity)"
    )
  if len(project) > PROJECT_MAX_LEN:
    raise ValueError(
        f"wandb.project={project[:20]!r}...: {len(project)} characters, and W&B allows at "
        f"most {PROJECT_MAX_LEN}: give a shorter name"
    )
  for tag in _tags(fields.get("tags", "")):
    if len(tag) > TAG_MAX_LEN:
      raise ValueError(
          f"wandb.tags: the tag {tag[:20]!r}... has {len(tag)} characters, and W&B allows at "
          f"most {TAG_MAX_LEN} a tag: shorten it (tags are comma-separated)"
      )


def _tags(text: str) -> list[str]:
  """wandb.tags' comma-separated tags, without blanks."""
  return [t.strip() for t in text.split(",") if t.strip()]


def check(config) -> None:
  """Before anything is built: the wandb.* fields (check_fields), and wandb is installed when
  the config logs to W&B."""
  check_fields(config)
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
    tags = _tags(fields.tags)
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
