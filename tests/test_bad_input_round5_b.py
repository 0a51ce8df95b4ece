"""Round five of bad inputs, part B: W&B fields that W&B refuses at the first step or that
nothing reads, evaluation tasks with no examples or a broken YAML, distillation messages that
pointed at the wrong fix, `compare`'s plot paths and unreadable metrics, and `data.split` on a
dataset folder that has no splits. Each case ends in the right behaviour or one `error:` line
naming the problem and the fix. Almost everything runs in this process."""

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _one_error_line(out: subprocess.CompletedProcess) -> str:
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith("error: ")
  return lines[0]


# ----------------------------------------------------------------------------- 1. W&B fields
@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"wandb.project": "bad/name"},
            r"^wandb.project='bad/name': a W&B project name cannot contain any of "
            r".*\(found /\): use e.g. 'bad-name'",
        ),
        ({"wandb.project": "a:b#c"}, r"^wandb.project='a:b#c': .*\(found # :\)"),
        ({"wandb.project": "p" * 129}, r"^wandb.project='p+'...: 129 characters, .* at most 128"),
        (
            {"wandb.project": "p", "wandb.tags": "ok," + "t" * 65},
            r"^wandb.tags: the tag 't+'... has 65 characters, .* at most 64",
        ),
        (
            {"wandb.mode": "offline"},
            r"^wandb.mode='offline': read only with wandb.project set: add "
            r"--config.wandb.project=NAME",
        ),
        ({"wandb.tags": "a,b"}, r"^wandb.tags='a,b': read only with wandb.project set"),
    ],
)
def test_wandb_fields_wandb_refuses_or_nothing_reads_stop_before_the_workdir(
    experiment, tmp_path, fields, message
):
  """A project named 'bad/name' ran until wandb.init raised a 47-line UsageError; wandb.mode
  (or any wandb.* field) without wandb.project was silently ignored."""
  from transformers_jax.config import ModelConfig
  from transformers_jax.train.entry import train
  from transformers_jax.train.field_checks import check_tracking

  config = experiment("gpt2", "tiny")
  config.unlock()
  config.update_from_flattened_dict(fields)
  with pytest.raises(ValueError, match=message):
    train(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()  # refused before the workdir is made
  with pytest.raises(ValueError, match=message):
    check_tracking(config, ModelConfig.from_dict(config.model))  # Setup's check too


def test_wandb_project_names_wandb_takes_pass(experiment):
  from transformers_jax.train import trackers

  config = experiment("gpt2", "tiny")
  trackers.check_fields(config)  # nothing set: nothing to check
  config.wandb.update(project="p" * 128, tags="t" * 64 + ", ,b", mode="offline", name="x/y")
  trackers.check_fields(config)


# ----------------------------------------------------------------------------- 2. evaluate tasks
TASKS_DIR = ROOT / "experiments" / "eval_tasks"


def _task_folder(tmp_path, data: str, yaml_text: str | None = None) -> pathlib.Path:
  """A copy of the local pysyntax_choice task (its loader, its YAML or `yaml_text`) whose data
  file holds `data`."""
  folder = tmp_path / "tasks"
  folder.mkdir()
  for name in ("local_data.py", "pysyntax_choice.yaml"):
    shutil.copy(TASKS_DIR / name, folder / name)
  if yaml_text is not None:
    (folder / "pysyntax_choice.yaml").write_text(yaml_text)
  (folder / "pysyntax_choice.jsonl").write_text(data)
  return folder


@pytest.mark.parametrize(
    "data, message",
    [
        ("", r"pysyntax_choice.jsonl holds no examples: write one JSON object a line"),
        ("\n  \n", r"pysyntax_choice.jsonl holds no examples"),
        ('{"context": "x"}\nnot json\n', r"pysyntax_choice.jsonl line 2 is not a JSON object"),
    ],
)
def test_a_local_task_without_examples_names_its_file(tmp_path, caplog, data, message):
  """An empty .jsonl ended `evaluate` in a 64-line IndexError from inside lm-eval."""
  from transformers_jax.evaluate import harness

  folder = _task_folder(tmp_path, data)
  manager = harness.task_manager(str(folder), ("pysyntax_choice",))
  with pytest.raises(ValueError, match=rf"^{re.escape(str(folder))}/{message}"):
    manager.load(["pysyntax_choice"])
  # lm-eval's advice about its own --metadata flag, two lines before the error, is dropped
  harness.quiet_lm_eval()
  caplog.clear()
  with pytest.raises(ValueError):
    manager.load(["pysyntax_choice"])
  assert not [r for r in caplog.records if "--metadata" in r.getMessage()]


def test_a_task_yaml_that_does_not_parse_is_named_with_its_line(tmp_path):
  """A YAML syntax error was reported as "task not found" (lm-eval skips such files)."""
  from transformers_jax.errors import UserError
  from transformers_jax.evaluate import harness

  text = (TASKS_DIR / "pysyntax_choice.yaml").read_text()
  broken = text.replace("output_type: multiple_choice", "output_type: multiple_choice: x")
  line = broken.splitlines().index("output_type: multiple_choice: x") + 1
  folder = _task_folder(tmp_path, "{}\n", broken)
  with pytest.raises(
      UserError,
      match=rf"^lm-eval task 'pysyntax_choice' not found: .*pysyntax_choice.yaml line {line}, "
      r"column \d+ does not parse \(mapping values are not allowed here\): fix that task YAML",
  ):
    harness.task_manager(str(folder), ("pysyntax_choice",))
  assert harness.unparsed_yaml(str(TASKS_DIR)) is None  # lm-eval's !function tags parse


# ----------------------------------------------------------------------------- 3. distillation
def _distill_student(experiment, teacher: pathlib.Path):
  """gpt2 tiny (one block) distilled from `teacher`, and its model config."""
  from transformers_jax.config import ModelConfig

  config = experiment("gpt2", "tiny")
  config.update_from_flattened_dict(
      {"model.num_layers": 1, "task": "distill", "distill.teacher": str(teacher)}
  )
  return config, ModelConfig.from_dict(config.model)


def _teacher_folder(experiment, folder: pathlib.Path, **fields) -> pathlib.Path:
  """A run folder whose config.json is gpt2 tiny's (one block) with `fields` set."""
  config, _ = _distill_student(experiment, "")
  config.update_from_flattened_dict({"task": "", "distill.teacher": "", **fields})
  folder.mkdir(parents=True)
  (folder / "config.json").write_text(config.to_json())
  return folder


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", float("inf"), r"^distill.temperature=inf: must be a positive finite"),
        ("temperature", float("nan"), r"^distill.temperature=nan: must be a positive finite"),
        ("temperature", 0.0, r"^distill.temperature=0.0: must be a positive finite"),
        ("alpha", float("nan"), r"^distill.alpha=nan: the soft term's weight lies in \[0, 1\]"),
        ("alpha", float("inf"), r"^distill.alpha=inf: the soft term's weight lies in \[0, 1\]"),
    ],
)
def test_distillation_refuses_temperatures_and_weights_that_are_not_finite(
    experiment, tmp_path, field, value, message
):
  """distill.temperature=inf passed the checks; the run died later with "loss became nan ...
  learning rate too high"."""
  from transformers_jax.train_config import validate

  config, model_cfg = _distill_student(experiment, _teacher_folder(experiment, tmp_path / "t"))
  validate(config, model_cfg, 1)  # the defaults pass
  config.distill[field] = value
  with pytest.raises(ValueError, match=message):
    validate(config, model_cfg, 1)


def test_a_population_teacher_is_refused_with_a_way_that_exists(experiment, tmp_path):
  """A population's run given as teacher failed once the data was built, telling the user to
  "pass --member=I", which distillation does not take."""
  from transformers_jax.train_config import validate

  teacher = _teacher_folder(
      experiment, tmp_path / "sweep", **{"population.learning_rates": "(1e-3, 3e-3)"}
  )
  config, model_cfg = _distill_student(experiment, teacher)
  with pytest.raises(
      ValueError,
      match=rf"^distill.teacher='{re.escape(str(teacher))}': a population's run, and a teacher "
      r"is one model \(distillation takes no member\): .* transformers_jax.convert --workdir "
      rf"{re.escape(str(teacher))} --member I --to_hf DIR, then convert --from_hf DIR",
  ):
    validate(config, model_cfg, 1)


def test_a_damaged_teacher_is_named_as_the_teachers_folder_not_the_students(experiment, tmp_path):
  """A teacher whose every checkpoint was damaged told the user to "use a new --workdir",
  although the student's folder was fine."""
  import numpy as np

  from transformers_jax.errors import UserError
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.train.setup import Setup

  teacher = _teacher_folder(experiment, tmp_path / "teacher")
  Run(teacher).save_params({"w": np.arange(64, dtype=np.float32)})
  stored = max(
      (p for p in (teacher / "checkpoints" / "0").rglob("*") if p.is_file()),
      key=lambda p: p.stat().st_size,
  )
  stored.write_bytes(b"\0" * stored.stat().st_size)  # same size, other bytes
  config, _ = _distill_student(experiment, teacher)
  setup = Setup(config)
  with pytest.raises(UserError) as caught:
    _ = setup.frozen  # the teacher is loaded at first use
  message = str(caught.value)
  assert message.startswith(f"the teacher run {teacher} is damaged, not this run's folder: ")
  assert f"copy an intact checkpoint into {teacher}/checkpoints" in message
  assert "new --workdir" not in message


# ----------------------------------------------------------------------------- 4. compare
def _metrics_run(folder: pathlib.Path, text: str = '{"step": 1, "loss": 2.0}\n') -> pathlib.Path:
  folder.mkdir(parents=True)
  (folder / "metrics.jsonl").write_text(text)
  return folder


def test_compare_writes_its_plot_where_it_says_and_never_into_the_working_directory(tmp_path):
  """The default plot went to compare.png in the working directory (a clone's root); --plot
  FOLDER wrote FOLDER.png and printed FOLDER; --plot into /proc was a bare errno."""
  from conftest import run_python

  run = _metrics_run(tmp_path / "runs" / "a")
  here = tmp_path / "here"
  here.mkdir()
  compare = ["-m", "transformers_jax.compare", str(run)]
  out = run_python(compare, cwd=here)  # the default: compare.png in the first run's folder
  assert out.returncode == 0, out.stderr[-2000:]
  assert f"loss curves: {run / 'compare.png'}\n" in out.stdout
  assert (run / "compare.png").read_bytes()[:4] == b"\x89PNG" and not list(here.iterdir())
  folder = tmp_path / "plots"
  folder.mkdir()
  out = run_python([*compare, f"--plot={folder}"], cwd=here)
  assert out.returncode == 0, out.stderr[-2000:]
  assert f"loss curves: {folder / 'compare.png'}\n" in out.stdout
  assert [p.name for p in folder.iterdir()] == ["compare.png"]
  assert not (tmp_path / "plots.png").exists()
  if pathlib.Path("/proc").is_dir():  # a place no file can be made in
    out = run_python([*compare, "--plot=/proc/compare.png"], cwd=here)
    assert _one_error_line(out).startswith(
        "error: --plot=/proc/compare.png: cannot write in /proc ("
    )


def test_compare_plot_paths_resolve_as_documented(tmp_path):
  from transformers_jax import compare

  run = _metrics_run(tmp_path / "run")
  assert compare.plot_path(None, [f"{run}:3"]) == run / "compare.png"
  assert compare.plot_path("", [str(run)]) is None
  assert compare.plot_path(str(tmp_path / "curves"), [str(run)]) == tmp_path / "curves.png"
  assert compare.plot_path(str(tmp_path / "c.svg"), [str(run)]) == tmp_path / "c.svg"


@pytest.mark.parametrize(
    "text, line",
    [
        ("\x00\x01garbage\nmore garbage\n", 1),
        ('{"step": 1, "loss": 2.0}\n[1, 2]\n{"step": 3, "loss": 1.0}\n', 2),
        ('{"step": 1, "loss": 2.0}\n{"loss": 1.0}\n', 2),
        ('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3, "loss": 1.0}\n', 2),
    ],
)
def test_compare_refuses_metrics_lines_it_cannot_read(tmp_path, text, line):
  """A garbage metrics.jsonl was shown as a run of 0 steps; only a torn last line (no newline
  after it: a killed process's) is skipped."""
  from transformers_jax import compare
  from transformers_jax.errors import UserError

  run = _metrics_run(tmp_path / "run", text)
  path = re.escape(str(run / "metrics.jsonl"))
  with pytest.raises(UserError, match=rf"^{path} line {line} is not a metrics line \("):
    compare.curves(str(run))
  (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n\n{"step": 2, "lo')
  assert compare.curves(str(run)) == [(str(run), {"loss": {1: 2.0}})]


# ----------------------------------------------------------------------------- 5. data.split
@pytest.fixture(scope="module")
def dataset_folders(tmp_path_factory):
  """A Dataset and a DatasetDict saved with save_to_disk, a folder of .parquet shards whose
  names name no split, one with split names, and a .txt file."""
  import datasets

  datasets.disable_progress_bars()
  root = tmp_path_factory.mktemp("splits")
  rows = datasets.Dataset.from_dict({"text": ["the quick brown fox", "jumps over a lazy dog"]})
  rows.save_to_disk(str(root / "dataset"))
  datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(root / "dict"))
  for folder, names in (("shards", ("a", "b")), ("named", ("data/train-0", "data/test-0"))):
    for name in names:
      (root / folder / name).parent.mkdir(parents=True, exist_ok=True)
      rows.to_parquet(str(root / folder / f"{name}.parquet"))
  (root / "corpus.txt").write_text("some text\n")
  return root


@pytest.mark.parametrize(
    "path, kind",
    [
        ("dataset", "a Dataset saved with save_to_disk \\(not a DatasetDict\\)"),
        ("shards", "a folder of shards whose file and folder names name no split"),
        ("corpus.txt", "one file"),
    ],
)
def test_a_split_on_a_dataset_without_splits_is_refused(experiment, dataset_folders, path, kind):
  """data.split='test' on a save_to_disk Dataset (or any source without splits) was ignored:
  the run trained on every row."""
  from transformers_jax.config import ModelConfig
  from transformers_jax.train_config import validate

  config = experiment("gpt2", "tiny")
  config.data.path = str(dataset_folders / path)
  model_cfg = ModelConfig.from_dict(config.model)
  validate(config, model_cfg, 1)  # the default split: read whole
  config.data.split = "test"
  with pytest.raises(
      ValueError,
      match=rf"^data.split='test': chooses a split of a Hugging Face dataset folder, and "
      rf"data.path '.*{re.escape(path)}' is {kind}, which has no splits: leave data.split at "
      r"'train' \(its default\)",
  ):
    validate(config, model_cfg, 1)


def test_a_split_is_taken_where_a_source_has_splits(experiment, dataset_folders):
  from transformers_jax.config import ModelConfig
  from transformers_jax.data import DataError, sources
  from transformers_jax.train_config import validate

  config = experiment("gpt2", "tiny")
  config.data.split = "test"
  model_cfg = ModelConfig.from_dict(config.model)
  with pytest.raises(ValueError, match=r"^data.split='test': .* reads its bundled data"):
    validate(config, model_cfg, 1)
  for path in ("dict", "named"):
    config.data.path = str(dataset_folders / path)
    validate(config, model_cfg, 1)
  # a mixture: the split is some source's (the others are read whole) ...
  config.data.path = ""
  config.data.mixture = f"{dataset_folders / 'dict'}:1,{dataset_folders / 'corpus.txt'}:1"
  validate(config, model_cfg, 1)
  config.data.mixture = f"{dataset_folders / 'dataset'}:1,{dataset_folders / 'corpus.txt'}:1"
  with pytest.raises(ValueError, match=r"^data.split='test': .* no source of data.mixture has"):
    validate(config, model_cfg, 1)
  # ... and shards whose names name no split are said to, not to "hold the split train"
  with pytest.raises(DataError, match=r"its file and folder names name no split"):
    sources.list_files(dataset_folders / "shards", "test")
