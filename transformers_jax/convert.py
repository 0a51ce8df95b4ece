"""Convert between Hugging Face checkpoints and this project's runs.

    python -m transformers_jax.convert --from_hf DIR --workdir OUT [--dtype bfloat16] [--scan_layers]
    python -m transformers_jax.convert --to_hf DIR --workdir RUN

`--from_hf` reads a local model folder (config.json + safetensors), or a model the local Hugging
Face cache holds by its hub name (`Qwen/Qwen3-0.6B`, `ORG/NAME@REVISION`; no network), and writes OUT
with an orbax checkpoint of the parameters (OUT/checkpoints/0), the run config (OUT/config.json
and OUT/config.py, usable as `--config OUT/config.py`) and the tokenizer if DIR has a
tokenizer.json. `generate --workdir OUT` samples from it (a GPT-2),
`python -m transformers_jax.param_count --config OUT/config.py` counts it, and
`train --config OUT/config.py --config.init_from=OUT` fine-tunes it. `--to_hf` writes
RUN's latest parameters as a directory Hugging Face's `from_pretrained` loads (`--member I`:
member I of a population's run); a LoRA run's adapters are merged into the weights, or with
`--lora=peft` written as a PEFT adapter folder (docs/lora.md).
"""

from __future__ import annotations

import pathlib
import re
import shutil

import jax
import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.config import DTYPES, ModelConfig
from transformers_jax.train_config import experiment_config
from transformers_jax.interop import hub_cache, load_hf, save_hf
from transformers_jax.interop.peft import save_peft_adapter
from transformers_jax.models import lora
from transformers_jax.modules.block import loop_to_scan, scan_to_loop
from transformers_jax.run_folder.export_target import check_export_target
from transformers_jax.run_folder.runs import Run

flags.DEFINE_string(
    "from_hf",
    None,
    "Hugging Face model to import: its folder, or ORG/NAME[@REVISION] from the local Hugging "
    "Face cache (HF_HUB_CACHE / HF_HOME; no network).",
)
flags.DEFINE_string("to_hf", None, "Directory to write a Hugging Face model into.")
flags.DEFINE_string(
    "workdir", None, "This project's run directory (written by --from_hf, read " "by --to_hf)."
)
flags.DEFINE_enum("dtype", "float32", list(DTYPES), "Parameter dtype on import.")
flags.DEFINE_bool("scan_layers", False, "Store the imported blocks in the scanned layout.")
flags.DEFINE_string(
    "mesh",
    "",
    "--from_hf: place each tensor, as it is read, onto a mesh of this host's devices, sharded "
    "as training shards it: a mesh preset (data | fsdp | fsdp_tensor) or axis sizes such as "
    "fsdp=4,tensor=2; default: the first device alone.",
)
flags.DEFINE_bool(
    "overwrite",
    False,
    "--to_hf: write into a folder that already holds files "
    "(its config.json and weights are replaced; never the run's own folder, nor a folder "
    "that holds a run).",
)
flags.DEFINE_integer(
    "member",
    None,
    "--to_hf of a population's run: the member to export (0-based, as `member` in its "
    "metrics.jsonl); required for a population, refused for a single run.",
)
flags.DEFINE_enum(
    "lora",
    "merge",
    ["merge", "peft"],
    "--to_hf of a LoRA run: `merge` folds the adapters into the weights (one plain model); "
    "`peft` writes them as a PEFT adapter folder in --to_hf, with the frozen base model in "
    "its base_model/ subfolder.",
)
flags.DEFINE_string(
    "architecture",
    None,
    "--to_hf: the Hugging Face class to write (e.g. MistralForCausalLM); default: the one the "
    "model's family and shape match (a RoPE decoder: LlamaForCausalLM, or Qwen2ForCausalLM "
    "with q/k/v biases).",
)
FLAGS = flags.FLAGS

CONFIG_PY = '''"""Config of a model converted from Hugging Face by transformers_jax.convert: the run
config saved beside this file as config.json. Use it as --config OUT/config.py."""

import pathlib

from transformers_jax.train_config import config_from_json


def get_config(arg=None):
  return config_from_json(pathlib.Path(__file__).with_name("config.json"))
'''


def _check_tokenizer(path: pathlib.Path) -> None:
  """A model folder's tokenizer.json is read now, not first at `generate --prompt`."""
  from transformers_jax.data import load_tokenizer

  try:
    load_tokenizer(path)
  except Exception as e:  # DataError, or the tokenizers library's own  # noqa: BLE001
    said = str(e.__cause__ or e).strip().splitlines()
    raise UserError(
        f"{path} is not a tokenizer this project reads ({said[0] if said else type(e).__name__})"
        ": replace it with the model's tokenizer.json, or remove it to import without one "
        "(generate --prompt_ids works without)"
    ) from None


# A Hugging Face folder's files besides the weights, config.json and tokenizer.json that a
# converted run keeps (in hf_files/) and an export writes back: the tokenizer's settings and
# chat template, its special tokens, a SentencePiece model, the generation defaults.
HF_FILES_KEPT = (
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
)


def _import_mesh(spec: str):
  """The mesh of this process's devices that --mesh names ('' = the default device alone)."""
  from transformers_jax.machine import parallel

  if not spec:
    return parallel.make_mesh({}, jax.devices()[:1])
  if "=" not in spec:
    axes = {"preset": spec}
  else:
    try:
      axes = {k.strip(): int(n) for k, n in (part.split("=") for part in spec.split(","))}
    except ValueError:
      raise UserError(
          f"--mesh={spec!r}: give a mesh preset ({', '.join(parallel.MESH_PRESETS)}) or axis "
          "sizes such as fsdp=4,tensor=2"
      ) from None
  try:
    return parallel.make_mesh(parallel.resolve_preset(axes), jax.local_devices())
  except ValueError as e:
    raise UserError(f"--mesh={spec!r}: {e}") from None


def import_hf(
    source, workdir, dtype: str = "float32", scan_layers: bool = False, mesh: str = ""
) -> dict:
  """Write Hugging Face folder `source` as a run in `workdir` (its parameters as checkpoint step
  0); returns the model's fields. Each tensor is placed onto the devices as it is read (no host
  copy of the whole model): onto the mesh `mesh` names (a mesh preset such as fsdp, or axis sizes
  such as fsdp=4,tensor=2), sharded as training shards it, or onto the default device.

  config.json is written last, so a folder without it holds no finished conversion: what an
  interrupted convert left there (`_check_workdir`) is replaced, with a note; a convert that fails
  removes what it wrote, so the same command can run again."""
  source = hub_cache.resolve(source)  # a hub name: its folder in the local cache
  tokenizer = source / "tokenizer.json"
  if tokenizer.is_file():
    _check_tokenizer(tokenizer)
  run = Run(workdir)
  leftovers = _check_workdir(run)  # before the model is read, which can take minutes
  fields, params = load_hf(source, dtype, mesh=_import_mesh(mesh))
  fields["scan_layers"] = scan_layers
  config = experiment_config(**fields)
  model_cfg = ModelConfig.from_dict(config.model)  # (refuses a scan over unlike blocks first)
  if scan_layers:
    params = loop_to_scan(params)
  config.seq_len = min(config.seq_len, model_cfg.max_len)
  if leftovers:
    for name in leftovers:
      _remove(run.path / name)
    print(
        f"note: {run.path} held what an interrupted convert left ({', '.join(leftovers)}) and "
        "no config.json: replaced"
    )
  before = _entries(run)
  try:
    run.save_params(params, step=0)
    (run.path / "config.py").write_text(CONFIG_PY)
    if tokenizer.is_file():
      shutil.copy(tokenizer, run.tokenizer_path)
    shutil.copy(source / "config.json", run.hf_config_path)  # its special token ids
    for name in HF_FILES_KEPT:  # carried back out by --to_hf
      if (source / name).is_file():
        run.hf_files_dir.mkdir(exist_ok=True)
        shutil.copy(source / name, run.hf_files_dir / name)
    run.write_config(config)  # last: it marks the conversion finished
  except BaseException:  # a full disk, Ctrl-C ...: what this call wrote goes, nothing else
    for path in sorted(_entries(run) - before, key=lambda p: len(p.parts)):
      _remove(path)
    raise
  return fields


# What `convert --from_hf` writes into its --workdir (beside config.json, written last), and in
# its checkpoints/ folder: the checksum record, checkpoint step 0 and orbax's temporary folders
# of a save that did not finish (STEP.orbax-checkpoint-tmp, with a timestamp in older orbax).
CONVERT_WRITES = ("checkpoints", "config.py", "tokenizer.json", "hf_config.json", "hf_files")
CONVERT_CHECKPOINT_FILES = re.compile(r"checksums\.json|0|0\.orbax-checkpoint-tmp.*")
# the temporary name config.json is written under (records.write_text_atomically)
CONFIG_JSON_PARTIAL = re.compile(r"\.config\.json\..*\.tmp")


def _check_workdir(run: Run) -> list[str]:
  """What an interrupted convert left in `run`'s folder, to replace ([] when its checkpoints/
  is missing or empty); refuses a folder that holds checkpoints of a run or a finished convert
  (it has config.json, or checkpoints convert does not write), and leftovers beside files that
  convert does not write, which are left alone."""
  checkpoints = run.checkpoint_dir
  if not checkpoints.is_dir() or not any(checkpoints.iterdir()):
    return []
  if run.config_path.exists() or any(
      not CONVERT_CHECKPOINT_FILES.fullmatch(p.name) for p in checkpoints.iterdir()
  ):
    raise UserError(f"{run.path} already holds checkpoints: convert into a new --workdir")
  names = [p.name for p in run.path.iterdir()]
  leftovers = sorted(n for n in names if n in CONVERT_WRITES or CONFIG_JSON_PARTIAL.fullmatch(n))
  others = sorted(set(names) - set(leftovers))
  if others:
    raise UserError(
        f"{run.path} holds what an interrupted convert left ({', '.join(leftovers)}) beside "
        f"other files ({', '.join(others)}): remove {', '.join(leftovers)} from it, or convert "
        "into a new --workdir"
    )
  return leftovers


def _entries(run: Run) -> set[pathlib.Path]:
  """The run folder, what it holds and what its checkpoints/ and hf_files/ hold (the folders
  convert writes into), as they are now."""
  found = {run.path} if run.path.exists() else set()
  for folder in (run.path, run.checkpoint_dir, run.hf_files_dir):
    if folder.is_dir():
      found.update(folder.iterdir())
  return found


def _remove(path: pathlib.Path) -> None:
  if path.is_dir() and not path.is_symlink():
    shutil.rmtree(path, ignore_errors=True)
  else:
    path.unlink(missing_ok=True)


def export_hf(
    workdir,
    target,
    overwrite: bool = False,
    member: int | None = None,
    lora_as: str = "merge",
    architecture: str | None = None,
) -> str:
  """Write run `workdir`'s latest parameters (population member `member`'s) as a Hugging Face
  folder `target`; returns the Hugging Face architecture written. A LoRA run's adapters are
  merged into the weights, or with `lora_as="peft"` written as a PEFT adapter folder `target`
  whose base model (the frozen weights) is `target`/base_model."""
  run = Run(workdir)
  if not run.config_path.is_file():
    raise UserError(f"{run.path} has no config.json: pass a run directory")
  check_export_target(run.path, pathlib.Path(target), overwrite)
  model_cfg = run.model_config()
  architecture = architecture or run.hf_architecture(model_cfg)  # as converted, where it fits
  params, step = run.load_params(member=member)
  if member is not None:  # say which model is exported
    from transformers_jax.train.members import chosen

    print(f"exporting {chosen(workdir, member)} of {run.path}, step {step}")
  # Hugging Face's layout is the looped one, whichever the checkpoint holds (a resume may
  # change model.scan_layers)
  params = scan_to_loop(jax.tree_util.tree_map(np.asarray, params))
  extra = {}
  tok = run.tokenizer()
  if tok is not None and tok.pad_id is not None:  # the id the run's tokenizer pads with
    extra["pad_token_id"] = int(tok.pad_id)
  model_folder = pathlib.Path(target)
  if lora_as == "peft":
    if not model_cfg.lora_rank:
      raise UserError(
          f"--lora=peft: {run.path} has no LoRA adapters (model.lora_rank is 0): leave --lora "
          "out to export the whole model"
      )
    model_folder = model_folder / "base_model"
    architecture = save_hf(
        model_folder,
        lora.without_lora(model_cfg),
        lora.base(params),
        architecture,
        extra_config=extra,
    )
    count = save_peft_adapter(
        target, model_cfg, params, architecture, base_model=str(model_folder.resolve())
    )
    print(f"wrote {count} LoRA adapters as a PEFT adapter folder; its base model: {model_folder}")
  else:
    architecture = save_hf(model_folder, model_cfg, params, architecture, extra_config=extra)
  tokenizer = run.tokenizer_path
  if tokenizer.is_file() and '"model"' in tokenizer.read_text()[:10_000]:  # an HF tokenizer file
    shutil.copy(tokenizer, model_folder / "tokenizer.json")
  for kept in sorted(run.hf_files_dir.glob("*")) if run.hf_files_dir.is_dir() else []:
    if kept.is_file() and not (model_folder / kept.name).exists():
      shutil.copy(kept, model_folder / kept.name)  # the tokenizer's settings, chat template …
  return architecture


# generate's flags for the text a family's model reads and for the token ids in its place
GENERATE_INPUTS = {
    "decoder": ("--prompt", "--prompt_ids"),
    "encoder_decoder": ("--source", "--source_ids"),
}


def tokenizer_note(family: str, source, workdir) -> str | None:
  """The note for a model `generate` runs (a decoder or an encoder-decoder) converted from a
  folder without tokenizer.json into `workdir`, which has no tokenizer then: its text flag
  needs one, its token-id flag works without; None for other families, or with a tokenizer."""
  if family not in GENERATE_INPUTS or Run(workdir).tokenizer_path.is_file():
    return None
  text, ids = GENERATE_INPUTS[family]
  return (
      f"note: {source} has no tokenizer.json, so {workdir} has no tokenizer: generate {text} "
      f"needs one (copy the model's tokenizer.json into {workdir}); {ids} works without"
  )


def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}: pass options as --flag=value")
  if not FLAGS.workdir or bool(FLAGS.from_hf) == bool(FLAGS.to_hf):
    raise UserError("give --workdir and exactly one of --from_hf DIR or --to_hf DIR")
  if FLAGS.from_hf:
    if FLAGS.lora != "merge":
      raise UserError(
          f"--lora={FLAGS.lora}: says how --to_hf writes a LoRA run's adapters; --from_hf "
          "imports a whole model: leave --lora out"
      )
    if FLAGS.member is not None:
      raise UserError(
          f"--member={FLAGS.member}: picks the member of a population's run to export with "
          "--to_hf; --from_hf imports one model: leave --member out"
      )
    fields = import_hf(FLAGS.from_hf, FLAGS.workdir, FLAGS.dtype, FLAGS.scan_layers, FLAGS.mesh)
    print(
        f"imported {fields['family']} model from {FLAGS.from_hf} into {FLAGS.workdir} "
        f"(checkpoint step 0, config.py, config.json)"
    )
    note = tokenizer_note(fields["family"], FLAGS.from_hf, FLAGS.workdir)
    if note:
      print(note)
  else:
    if FLAGS.mesh:
      raise UserError(
          f"--mesh={FLAGS.mesh}: places the tensors --from_hf reads; --to_hf reads the run's "
          "checkpoint onto the host: leave --mesh out"
      )
    architecture = export_hf(
        FLAGS.workdir, FLAGS.to_hf, FLAGS.overwrite, FLAGS.member, FLAGS.lora, FLAGS.architecture
    )
    print(f"exported {FLAGS.workdir} as {architecture} into {FLAGS.to_hf}")


if __name__ == "__main__":
  cli.run(main)
