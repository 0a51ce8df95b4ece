"""Top-level training fields of an experiment config (every one has a default and a meaning),
and the assembly of a whole experiment config: those fields plus the model's (config/model.py)."""

from __future__ import annotations

import ast
import math
import pathlib
from collections.abc import Mapping
from typing import Any

import ml_collections

from transformers_jax.config import model_config_dict
from transformers_jax.data.fields import add_data_fields, check_split_is_read
from transformers_jax.machine.parallel import rule_names
from transformers_jax.records import flatten_dict, read_config

# Learning-rate schedules after the linear warmup (train/optim.py builds them).
SCHEDULES = ("cosine", "linear", "constant", "rsqrt")
# Largest z_loss weight: PaLM uses 1e-4; beyond 1 the penalty outweighs the loss it steadies.
MAX_Z_LOSS = 1.0
# population list -> the training field each of its values stands for
POPULATION_LISTS = {
    "learning_rates": "learning_rate",
    "weight_decay": "weight_decay",
    "warmup_steps": "warmup_steps",
    "z_loss": "z_loss",
}


def training_fields() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # the training objective, a name of the task registry (transformers_jax/tasks; --config_help
  # lists them); "" = the model's own: lm (decoder), mlm or classify_text (encoder, by head),
  # seq2seq (encoder_decoder), classify_image (vit)
  c.task = ""
  c.steps = 1000  # optimizer updates (the schedule spans these)
  c.stop_after = 0  # end this invocation after this many total steps, with a checkpoint; 0 = steps
  c.batch_size = 32  # global batch (examples per update, over all devices and micro-batches)
  c.seq_len = 128  # tokens per example (LM, MLM, classification; seq2seq source and target)
  c.learning_rate = 1e-3  # peak learning rate (reached at the end of warmup)
  c.lr_schedule = "cosine"  # cosine | linear | constant | rsqrt (the 2017 paper's inverse sqrt)
  c.min_lr_ratio = 0.1  # cosine: final learning rate as a fraction of the peak
  c.warmup_steps = 100  # linear warmup from 0 to the peak
  c.weight_decay = 0.1  # AdamW decoupled weight decay
  c.decay_embeddings = False  # also decay embedding tables (biases and norms never are)
  c.adam_b1 = 0.9  # Adam's decay rate of the gradient's running mean
  c.adam_b2 = 0.95  # Adam's decay rate of the squared gradient's running mean
  c.adam_eps = 1e-8  # added to Adam's denominator (the root of the squared-gradient mean)
  c.grad_clip = 1.0  # global-norm clipping; 0 = off
  c.grad_accum_steps = 1  # micro-batches per update (batch_size must divide evenly)
  c.label_smoothing = 0.0  # label smoothing of the cross-entropy (the 2017 paper used 0.1)
  c.moe_aux_weight = 0.01  # weight of the MoE load-balancing loss (Switch Transformer)
  c.moe_router_z_weight = 0.0  # weight of the MoE router z-loss (ST-MoE uses 1e-3); 0 = off
  c.z_loss = 0.0  # weight of log(Z)^2, the squared log-partition of the output logits; 0 = off
  c.loss_chunks = 1  # LM loss over this many chunks of each row: no [tokens, V] logits at once
  # parts of the train state kept in the host's pinned memory between steps and brought to the
  # devices inside each: optimizer (Adam's moments), params, or optimizer,params; "" = none
  c.host_offload = ""
  c.seed = 0  # parameters, dropout and the batch stream all derive from it
  c.log_every = 50  # steps between metrics lines
  c.eval_every = 500  # steps between held-out evaluations (and at the end); 0 = only at the end
  c.eval_batches = 8  # held-out batches per evaluation
  c.checkpoint_every = 500  # steps between checkpoints (and at the end); 0 = only at the end
  c.keep_checkpoints = 2  # how many recent checkpoints to keep
  # population: train many members as one vmapped program (train/population.py); every
  # combination of the lists below is a member, each with its own seed. The lists are tuples
  # written as strings, e.g. --config.population.learning_rates="(1e-3, 3e-3)"; "" = the single
  # value of the top-level field. seeds=0 and every list "" = an ordinary single run.
  c.population = ml_collections.ConfigDict(
      {
          "seeds": 0,  # members per hyperparameter combination: seeds seed, seed+1, ...
          "learning_rates": "",
          "weight_decay": "",
          "warmup_steps": "",
          "z_loss": "",
      }
  )
  c.init_from = ""  # a run (or its checkpoints/, or one step there) whose parameters start ours
  c.init_member = -1  # init_from a population's run: the member to take (-1: not a population)
  add_data_fields(c)  # the `data` group: data/fields.py
  # device mesh: axis sizes (-1 = the rest) or a preset: data | fsdp | fsdp_tensor
  # topology: with --compile_only, a TPU topology to compile for instead of this host's devices
  # (e.g. v5p:4x4x4, v5e:16x16; needs the `tpu` extra), "" = this host's devices
  c.mesh = ml_collections.ConfigDict(
      {
          "preset": "",
          "data": -1,
          "fsdp": 1,
          "context": 1,  # devices each sequence's tokens are split over (long context)
          "tensor": 1,
          "expert": 1,
          "topology": "",
          # slices joined by the data-center network (DCN): the axes above are within a slice,
          # the dcn_* ones across slices (each mesh axis is their product); topology: one slice
          "num_slices": 1,
          "dcn_data": -1,  # slices the data axis spans (-1 = the rest)
          "dcn_fsdp": 1,  # slices the fsdp axis spans (parameters sharded across slices too)
          "stage": 1,  # pipeline stages: each holds L/stage blocks (docs/pipeline.md)
          "dcn_stage": 1,  # slices the stage axis spans (stage-to-stage sends cross them)
      }
  )
  # mesh.stage > 1: microbatches per update (0 = one per stage); passes over the stages (1 = GPipe)
  c.pipeline = ml_collections.ConfigDict({"microbatches": 0, "repeats": 1})
  # logical-axis rule overrides, one field per logical name (transformers_jax/machine/parallel.py):
  # unset = the default rule, "" = replicated, "fsdp" or "data,fsdp" = the mesh axes to split over;
  # e.g. --config.rules.mlp='' keeps the feed-forward hidden dimension whole on every device
  c.rules = ml_collections.ConfigDict(
      {name: ml_collections.config_dict.placeholder(str) for name in rule_names()}
  )
  # MFU: peak FLOP/s of one device; 0 = the data sheet of the reported device kind (a CPU: measured)
  c.device_peak_flops = 0.0
  # a jax.profiler trace of steps [start_step, start_step + num_steps) in WORKDIR/tb; 0 steps = off
  c.profile = ml_collections.ConfigDict({"start_step": 0, "num_steps": 0})
  c.wandb = ml_collections.ConfigDict()  # Weights & Biases logging (docs/tracking.md)
  c.wandb.project = ""  # W&B project to log to (process 0); "" = no W&B logging
  c.wandb.entity = ""  # W&B team or user owning the project; "" = the account's default
  c.wandb.name = ""  # run name shown in W&B; "" = the workdir's folder name
  c.wandb.group = ""  # W&B group of related runs (a sweep, an ablation); "" = none
  c.wandb.tags = ""  # comma-separated W&B tags, e.g. "baseline,gpt2"
  c.wandb.notes = ""  # a longer description of the run, shown in W&B
  c.wandb.mode = ""  # online | offline (no network) | disabled; "" = $WANDB_MODE, else online
  c.eval_harness = ml_collections.ConfigDict()  # lm-eval tasks in training (docs/tracking.md)
  c.eval_harness.every = 0  # steps between harness evaluations (and at the last step); 0 = off
  c.eval_harness.tasks = ""  # comma-separated lm-eval task or group names, e.g. "pysyntax_choice"
  c.eval_harness.include_path = ""  # a folder of task YAMLs, searched before lm-eval's own tasks
  c.eval_harness.limit = 0  # examples per task; 0 = all
  c.eval_harness.num_fewshot = -1  # few-shot examples before each prompt; -1 = each task's own
  c.eval_harness.batch_size = 16  # sequences per forward pass, split over the data-parallel devices
  c.eval_harness.max_gen_toks = 256  # generate_until: most new tokens when a task does not say
  c.eval_harness.bootstrap_iters = 1000  # resamples for bootstrapped standard errors; 0 = none
  c.sample = ml_collections.ConfigDict()
  c.sample.prompt = "def "  # prompt of the end-of-run sample (decoder-only)
  c.sample.max_new_tokens = 120  # length of the end-of-run sample; 0 = no sample
  c.sample.temperature = 0.8  # 0 = greedy
  c.sample.top_k = 40  # sample from the k most likely tokens; 0 = all
  return c


# The fields that must be >= 0, and what 0 means for each (validate's message for a negative).
OFF = "0 turns it off"
NON_NEGATIVE = {
    "stop_after": "0 runs to steps",
    "warmup_steps": "0 starts at the peak rate",
    "eval_every": "0 evaluates only at the end",
    "checkpoint_every": "0 saves only at the end",
    "grad_clip": OFF,
    "weight_decay": OFF,
    "moe_aux_weight": OFF,
    "moe_router_z_weight": OFF,
    "z_loss": OFF,
    "population.seeds": "0 and no list: a single run",
    "sample.max_new_tokens": OFF,
    "sample.top_k": OFF,
    "device_peak_flops": "0 takes the device's data sheet, or measures a CPU",
    "profile.start_step": "0 profiles from the first step",
    "profile.num_steps": OFF,
}


def validate(config, model_cfg, num_data_shards: int, task=None) -> None:
  """Every training field has a meaning or is refused: a ValueError naming the field and the
  fix, before any data is read or anything compiles. The objective's own settings are its
  Task's to check (Task.check; `task`: the run's, else the config's)."""
  from transformers_jax.tasks import check_other_tasks_fields, task_for

  task = task or task_for(model_cfg, config)
  check_other_tasks_fields(config, task)

  def fail(field, problem):
    raise ValueError(f"{field}={config_value(config, field)!r}: {problem}")

  for field in (
      "steps",
      "batch_size",
      "seq_len",
      "grad_accum_steps",
      "log_every",
      "eval_batches",
      "keep_checkpoints",
  ):
    if config[field] < 1:
      fail(field, "must be a positive integer")
  for field, zero in NON_NEGATIVE.items():
    value = config_value(config, field)
    if not math.isfinite(value) or value < 0:
      fail(field, f"must be >= 0 ({zero})")
  if not isinstance(config.seed, int) or config.seed < 0:
    fail("seed", "must be an integer >= 0 (parameters, dropout and batches derive from it)")
  if not (math.isfinite(config.learning_rate) and config.learning_rate > 0):
    fail("learning_rate", "must be positive (a negative rate climbs the loss)")
  if config.z_loss > MAX_Z_LOSS:
    fail("z_loss", f"must be at most {MAX_Z_LOSS:g} (PaLM uses 1e-4)")
  if config.profile.num_steps and config.profile.start_step >= config.steps:
    fail(
        "profile.start_step",
        f"the run has {config.steps} steps, so nothing would be profiled: start before step "
        f"{config.steps}",
    )
  _check_population_lists(config)
  for field in ("adam_b1", "adam_b2"):
    if not 0 <= config[field] < 1:
      fail(field, "Adam's decay rates lie in [0, 1)")
  if config.lr_schedule not in SCHEDULES:
    fail("lr_schedule", f"choose one of {', '.join(SCHEDULES)}")
  for field in ("data.workers", "data.prefetch", "data.tokenize_workers"):
    if config_value(config, field) < 0:
      fail(field, "must be >= 0")
  mixture = []
  if config.data.get("mixture", ""):
    from transformers_jax.data.mixture import parse_mixture

    if config.data.path:
      fail("data.mixture", "names the sources instead of data.path: leave data.path empty")
    mixture = parse_mixture(config.data.mixture)  # a DataError (one line) for a malformed one
  if not str(config.data.get("split", "train")).strip():
    fail("data.split", "names a split of a Hugging Face dataset folder, e.g. train")
  check_split_is_read(config.data, [s.path for s in mixture])
  task.check(config, model_cfg)
  if config.data.max_bytes < 1:
    fail("data.max_bytes", "must be a positive number of bytes")
  if config.get("init_member", -1) < -1:
    fail("init_member", "a member index is >= 0 (-1: init_from is not a population)")
  if config.get("init_member", -1) >= 0 and not config.init_from:
    fail("init_member", "picks a member of --config.init_from's population: set init_from")
  for field, ok, problem in (
      ("adam_eps", config.adam_eps > 0, "must be positive"),
      ("min_lr_ratio", 0 <= config.min_lr_ratio <= 1, "must be in [0, 1]"),
      ("label_smoothing", 0 <= config.label_smoothing < 1, "must be in [0, 1)"),
  ):
    if not ok:
      fail(field, problem)
  if not 0 < config.data.mlm_probability <= 1:
    fail("data.mlm_probability", "the fraction of tokens predicted must be in (0, 1]")
  temperature = config.sample.temperature
  if not (math.isfinite(temperature) and temperature >= 0):
    fail("sample.temperature", "must be a finite number >= 0 (0 = greedy)")
  if task.reads_seq_len and config.seq_len > model_cfg.max_len:
    raise ValueError(
        f"seq_len={config.seq_len} is longer than model.max_len="
        f"{model_cfg.max_len}: lower --config.seq_len or raise "
        "--config.model.max_len"
    )
  validate_context(config, model_cfg, task)
  if config.batch_size % config.grad_accum_steps:
    raise ValueError(
        f"batch_size={config.batch_size} is not divisible by grad_accum_steps="
        f"{config.grad_accum_steps}"
    )
  micro = config.batch_size // config.grad_accum_steps
  if micro % num_data_shards:
    raise ValueError(
        f"the micro-batch of {micro} examples does not split over the "
        f"{num_data_shards} data-parallel shards: make batch_size / "
        f"grad_accum_steps a multiple of {num_data_shards}"
    )


def _check_population_lists(config) -> None:
  """Each population list (a tuple written as a string) holds numbers that the field it varies
  accepts: no booleans, strings or NaNs, rates positive, z_loss within MAX_Z_LOSS."""
  population = config.get("population")
  for name, field in POPULATION_LISTS.items():
    text = str(population.get(name, "") if population is not None else "").strip()
    if not text:
      continue
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
      value = text
    values = value if isinstance(value, (tuple, list)) else (value,)
    example = f'give a tuple of numbers, e.g. --config.population.{name}="(1e-3, 3e-3)"'
    for v in values or ("(empty)",):
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"population.{name}={text!r}: {v!r} is not a number: {example}")
    if field == "learning_rate" and min(values) <= 0:
      raise ValueError(f"population.{name}={text!r}: learning rates must be positive")
    if min(values) < 0:
      raise ValueError(f"population.{name}={text!r}: values must be >= 0")
    if field == "z_loss" and max(values) > MAX_Z_LOSS:
      raise ValueError(f"population.{name}={text!r}: z_loss weights are at most {MAX_Z_LOSS:g}")


def validate_context(config, model_cfg, task=None) -> None:
  """mesh.context > 1 splits each sequence's tokens over that many devices (zig-zag balanced
  in 2 x context chunks where the task's attention is causal): the lengths must divide."""
  shards = int(config.mesh.get("context", 1))
  if shards <= 1:
    return
  if model_cfg.attention_dropout > 0:
    raise ValueError(
        f"mesh.context={shards}: attention dropout is not applied over a split sequence; set "
        "--config.model.attention_dropout=0 or --config.mesh.context=1"
    )
  from transformers_jax.tasks import task_for

  task = task or task_for(model_cfg, config)
  length = task.tokens_per_example(model_cfg, config)
  parts = 2 * shards if task.attends_causally(model_cfg) else shards
  what = "seq_len" if task.reads_seq_len else "the patch sequence (with class token)"
  if length % parts:
    raise ValueError(
        f"mesh.context={shards}: {what} of {length} tokens does not split into {parts} equal "
        + ("zig-zag chunks" if parts > shards else "parts")
        + f": make it a multiple of {parts} or change --config.mesh.context"
    )


def config_value(config, dotted: str):
  for key in dotted.split("."):
    config = config[key]
  return config


# The training fields of the presets that run on a CPU: `TINY_RUN` for the few-minute "tiny"
# presets the tests and examples train, `CPU_RUN` for the README's quick start (a few minutes
# on a 2-core CPU). experiments/ files name these rather than restating them.
TINY_RUN = dict(
    steps=200,
    batch_size=16,
    seq_len=64,
    learning_rate=3e-3,
    warmup_steps=20,
    log_every=20,
    eval_every=100,
    checkpoint_every=100,
)
CPU_RUN = dict(
    steps=500,
    batch_size=16,
    seq_len=128,
    learning_rate=2e-3,
    warmup_steps=50,
    log_every=25,
    eval_every=250,
    checkpoint_every=250,
)


def experiment_config(
    published_params: int = 0,
    published_source: str = "",
    training: Mapping[str, Any] | None = None,
    **model,
) -> ml_collections.ConfigDict:
  """The full experiment config every file in experiments/ returns from `get_config(arg)`.

  Training fields (see train_config.py) at the top level, `model` holds ModelConfig fields,
  `published` the figure a preset is checked against (0 = none).
  """
  from transformers_jax.tasks import task_config_groups

  config = training_fields()
  config.update(task_config_groups())  # each objective's own fields (Task.config_defaults)
  config.model = model_config_dict(**model)
  config.published = ml_collections.ConfigDict(
      {
          "params": published_params,  # the published parameter count a preset is checked against; 0 = none
          "source": published_source,  # where the published count comes from
      }
  )
  for key, value in (training or {}).items():
    if isinstance(value, Mapping):
      config[key].update(value)
    else:
      config[key] = value
  return config


def preset_config(
    file: str,
    presets: Mapping[str, dict],
    arg: str | None,
    base: dict,
    source: str,
    training: Mapping[str, dict] | None = None,
    default: str = "tiny",
) -> ml_collections.ConfigDict:
  """Every experiments/*.py `get_config(arg)`: the preset (an error lists the choices) over the
  family's `base` fields, with its published count and its training fields."""
  name = arg or default
  if name not in presets:
    raise ValueError(f"{file}: unknown preset {name!r}; choose one of {', '.join(presets)}")
  preset = dict(presets[name])
  published = preset.pop("published_params", 0)
  source = preset.pop("published_source", source)  # a preset whose figure has its own source
  return experiment_config(
      published, source if published else "", (training or {}).get(name), **{**base, **preset}
  )


def config_from_json(path) -> ml_collections.ConfigDict:
  """An experiment config saved as JSON (a run's config.json) -> a ConfigDict again."""
  saved = read_config(pathlib.Path(path))
  if saved is None:
    raise FileNotFoundError(f"{path}: no such file")
  config = experiment_config(**saved.pop("model"))
  config.update_from_flattened_dict(flatten_dict(saved))
  return config
