"""Hugging Face checkpoints <-> our config fields and parameter trees: the files and the two
directions. What one model type means (config keys, tensor names, heads) lives in its Family:
interop/gpt2.py, bert.py, vit.py; adding an architecture is one such file, listed in FAMILIES.

    fields, params = load_hf("path/to/gpt2")          # config.json + model.safetensors (or shards)
    model = build_model(fields); model.apply({"params": params}, tokens)
    save_hf("path/to/out", fields, params)            # loadable by transformers' from_pretrained

Only numpy and `safetensors` are used: no torch, no transformers, no pickle files.

Architectures: GPT2LMHeadModel / GPT2Model (decoder, pre-LN, `lm` head tied to the token embedding
unless tie_word_embeddings is false), BertModel / BertForMaskedLM (encoder, post-LN with the
embedding norm, `pooler` / `mlm` head), ViTModel / ViTForImageClassification (vit, pre-LN, class
token, `pooler` (or `none` when the checkpoint has no pooler) / `classifier` head),
LlamaForCausalLM / MistralForCausalLM / MixtralForCausalLM / Qwen2ForCausalLM / GemmaForCausalLM
/ Gemma2ForCausalLM (decoder, pre-norm RMSNorm, RoPE, gated feed-forward, grouped-query
attention; interop/llama.py and gemma.py), Qwen3ForCausalLM / SmolLM3ForCausalLM /
Gemma3ForCausalLM / Olmo2ForCausalLM / Olmo3ForCausalLM / Phi3ForCausalLM (q/k norms, per-layer
sliding windows and NoPE layers, reordered norms, fused projections; interop/qwen3.py,
gemma3.py, olmo.py, phi3.py), GptOssForCausalLM / Qwen3MoeForCausalLM (the same with experts:
gpt-oss's attention sinks, biases and clamped SwiGLU, Qwen3-MoE's q/k norms; interop/gpt_oss.py
and qwen3_moe.py), T5ForConditionalGeneration (encoder-decoder,
T5's relative bias, unscaled scores; interop/t5.py), MarianMTModel (encoder-decoder, post-LN,
fixed sinusoids; interop/marian.py), BartForConditionalGeneration (encoder-decoder, post-LN,
positions and embedding norm per stack; interop/bart.py).

Layouts. Parameters come back unscanned (`layer_0` … `layer_{L-1}`; `loop_to_scan` from
modules/block.py gives the `scan_layers` layout). torch Linear weights are [out, in] and are
transposed; GPT-2's Conv1D weights are already [in, out] and its fused `c_attn` is split into
query, key and value; attention kernels are reshaped to [D, H, K] and [H, K, D]; ViT's patch
convolution [D, C, P, P] becomes the `patch_embed` kernel over patches flattened in (row, col,
channel) order, as `patchify` lays them out; ViT's [1, N, D] position table loses its batch axis.

Every problem raises an `HFCheckpointError` (a ValueError) with one line naming the problem and
the fix: an unsupported architecture or option, a missing or unreadable file, a missing,
unexpected or wrongly shaped tensor.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any
from collections.abc import Mapping

import numpy as np

from transformers_jax.config import ModelConfig
from transformers_jax.interop.common import (
    CorruptCheckpoint,
    MissingCheckpointFile,
    MissingTensor,
    TensorShapeMismatch,
    UnexpectedTensor,
    UnsupportedArchitecture,
    hf_shapes,
    to_ours,
)
from transformers_jax.interop.families import (
    FAMILY_OF,
    INDEX,
    MODEL_TYPE_DEFAULT,
    SUPPORTED_ARCHITECTURES,
    WEIGHTS,
    expected_shapes,
    flatten,
)
from transformers_jax.interop.tensor_files import TensorFiles, UnreadableFile


# ----------------------------------------------------------------------------- files
def _read_json(path: pathlib.Path, what: str) -> dict:
  try:
    return json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CorruptCheckpoint(
        f"{path}: {what} is not valid JSON ({e}): re-download or re-save " "the checkpoint"
    ) from None


def _check_safetensors(path: pathlib.Path) -> pathlib.Path:
  """`path` when it is a regular file; the error saying what it is otherwise."""
  if path.exists() and not path.is_file():  # a folder, a device (a link to /dev/zero) ...
    raise CorruptCheckpoint(
        f"{path} is not a regular file ({'a folder' if path.is_dir() else 'a device or pipe'}"
        f"{f', linked to {path.resolve()}' if path.is_symlink() else ''}): put the model's "
        "safetensors file there; re-download or re-save it"
    )
  if not path.is_file():
    raise MissingCheckpointFile(
        f"{path} does not exist: the checkpoint is incomplete; " "re-download or re-save it"
    )
  return path


def _unreadable(path, error) -> CorruptCheckpoint:
  return CorruptCheckpoint(
      f"{path} is not a readable safetensors file ({error}): it is truncated or "
      "corrupt; re-download or re-save it"
  )


def _read_tensors(directory: pathlib.Path) -> TensorFiles:
  """The checkpoint's tensors, read one by one when taken (interop/tensor_files.py); opening
  reads every file's header (safetensors refuses one that promises more data than the file
  holds)."""
  try:
    return TensorFiles(_safetensors_paths(directory))
  except UnreadableFile as e:
    raise _unreadable(e.path, e) from None


def _safetensors_paths(directory: pathlib.Path) -> list[pathlib.Path]:
  if (directory / WEIGHTS).exists():  # (a file, or something else that _check_safetensors names)
    return [_check_safetensors(directory / WEIGHTS)]
  if (directory / INDEX).is_file():
    index = _read_json(directory / INDEX, "the shard index")
    if not isinstance(index.get("weight_map"), dict):
      raise CorruptCheckpoint(f"{directory / INDEX} has no weight_map: re-save the checkpoint")
    paths = []
    roots = _readable_roots(directory)
    for shard in sorted(set(index["weight_map"].values())):
      name = pathlib.PurePosixPath(str(shard))
      path = (directory / str(shard)).resolve()
      if name.is_absolute() or ".." in name.parts or not any(r in path.parents for r in roots):
        raise CorruptCheckpoint(
            f"{directory / INDEX} names the shard {shard!r}, which lies "
            "outside the model folder: only files inside it (or, in a Hugging Face cache, "
            "in its repository's blobs/) are read; "
            "re-save the checkpoint"
        )
      paths.append(_check_safetensors(path))
    return paths
  others = sorted(
      p.name
      for p in directory.iterdir()
      if p.suffix in (".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")
  )
  found = (
      (f" (found {', '.join(others)}, which is not read: pickle and framework files are " "unsafe)")
      if others
      else ""
  )
  raise MissingCheckpointFile(
      f"{directory}: no {WEIGHTS} or {INDEX}{found}: save the model with "
      "save_pretrained(..., safe_serialization=True)"
  )


def _readable_roots(directory: pathlib.Path) -> list[pathlib.Path]:
  """Folders the files of a model folder may resolve into: the folder itself, and in a Hugging
  Face cache (models--org--name/snapshots/<revision>/, every file a symlink into ../../blobs/)
  that repository's blobs."""
  roots = [directory.resolve()]
  if directory.resolve().parent.name == "snapshots":
    roots.append(directory.resolve().parent.parent / "blobs")
  return roots


# Architectures known and refused, with what they need that the shared block does not have.
NOT_BUILT = {
    "MambaForCausalLM": "selective state-space layers in place of attention have no counterpart "
    "in the shared block",
}


def _architecture(hf: Mapping, directory: pathlib.Path) -> str:
  names = list(hf.get("architectures") or [])
  for name in names:
    if name in SUPPORTED_ARCHITECTURES:
      return name
  model_type = hf.get("model_type")
  if not names and model_type in MODEL_TYPE_DEFAULT:
    return MODEL_TYPE_DEFAULT[model_type]
  found = ", ".join(names) if names else f"model_type={model_type!r}"
  why = next((f" ({NOT_BUILT[n]})" for n in names if n in NOT_BUILT), "")
  raise UnsupportedArchitecture(
      f"{directory}: config.json describes {found}, which cannot be imported{why}: supported "
      f"architectures are {', '.join(SUPPORTED_ARCHITECTURES)}"
  )


def _strip(name: str, prefix: str) -> str:
  name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)  # original BERT checkpoints
  name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
  return name[len(prefix) :] if prefix and name.startswith(prefix) else name


def _nest(flat: Mapping[tuple[str, ...], Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


# ----------------------------------------------------------------------------- public API
def load_hf(
    directory, dtype: str = "float32", mesh=None, rules=None
) -> tuple[dict[str, Any], dict]:
  """Read a local Hugging Face model directory -> (ModelConfig fields, unscanned params).

  The parameters are numpy arrays of `dtype` (recorded as the fields' `param_dtype`); the tree
  matches `param_shapes(ModelConfig(**fields))`. With a `mesh`, each one is placed onto it as
  soon as it is converted, sharded as the logical-axis `rules` say (default: training's,
  parallel.rules()), so the host never holds more than one tensor: a model larger than one
  host's memory can be read onto the devices of a pod slice.
  """
  from transformers_jax.config import DTYPES
  from transformers_jax.modules.common import dtype_of

  directory = pathlib.Path(directory)
  if dtype not in DTYPES:
    raise ValueError(f"dtype={dtype!r}: choose one of {', '.join(DTYPES)}")
  if not directory.is_dir():
    raise MissingCheckpointFile(
        f"{directory} is not a directory: pass the folder that holds config.json and "
        "model.safetensors"
    )
  if not (directory / "config.json").is_file():
    raise MissingCheckpointFile(
        f"{directory}: no config.json: pass a directory written by save_pretrained (or "
        "save_hf), which holds config.json"
    )
  raw = _read_json(directory / "config.json", "config.json")
  if not isinstance(raw, dict):
    raise CorruptCheckpoint(
        f"{directory}/config.json holds a JSON {type(raw).__name__}, not an object of settings: "
        "use the config.json saved with the weights"
    )
  architecture = _architecture(raw, directory)
  family = FAMILY_OF[architecture]
  hf = family.config(raw)
  try:
    fields = family.fields(hf, architecture, f"{directory}/config.json")
  except TypeError as e:  # e.g. arithmetic on a size given as an object
    raise CorruptCheckpoint(
        f"{directory}/config.json holds a value of the wrong type ({e}): use the config.json "
        "saved with the weights"
    ) from None
  except KeyError as e:
    raise CorruptCheckpoint(
        f"{directory}/config.json has no {e.args[0]!r}, which {architecture} needs: use the "
        "config.json saved with the weights"
    ) from None
  tensors = _read_tensors(directory).renamed(lambda k: _strip(k, family.load_prefix))
  family.adjust_loaded(tensors, fields)
  fields["param_dtype"] = dtype
  try:
    c = ModelConfig(**fields)
  except ValueError as e:
    raise UnsupportedArchitecture(
        f"{directory}/config.json maps to an invalid model: {_config_key(e, fields, raw)}{e}"
    ) from None

  expected = expected_shapes(c)
  place = _placer(c, mesh, rules) if mesh is not None else None
  flat: dict[tuple[str, ...], Any] = {}
  np_dtype = dtype_of(dtype)
  for rule in family.rules(c, ""):
    missing = [n for n in rule.hf if n not in tensors]
    if missing:
      raise MissingTensor(
          f"{directory}: tensor {_full_name(missing[0], architecture)} is missing, but "
          f"{architecture} with this config.json needs it: the weights are incomplete or belong "
          "to another architecture"
      )
    shapes = [expected[p] for p in rule.ours]
    for name, want in zip(rule.hf, hf_shapes(rule, shapes)):
      got = tuple(tensors.shape(name))
      if got != tuple(want):
        raise TensorShapeMismatch(
            f"{directory}: tensor {_full_name(name, architecture)} has shape {got}, but "
            f"config.json ({family.summary(hf)}) implies {tuple(want)}: the weights and "
            "config.json come from different models; use the config.json saved with them"
        )
    arrays = [_take(tensors, n, directory, architecture) for n in rule.hf]
    arrays = to_ours(rule, arrays, shapes)
    for path, array in zip(rule.ours, arrays):
      array = np.ascontiguousarray(array.astype(np_dtype, copy=False))
      flat[path] = place(path, array) if place else array
    del arrays, array  # the host copies, before the next tensor is read
  ignorable = re.compile("|".join(f"(?:{p})" for p in family.ignorable(c)) or "(?!)")
  left = sorted(_full_name(n, architecture) for n in tensors if not ignorable.fullmatch(n))
  if left:
    more = f" and {len(left) - 3} more" if len(left) > 3 else ""
    raise UnexpectedTensor(
        f"{directory}: tensors {', '.join(left[:3])}{more} are not used by {architecture} with "
        f"this config.json ({family.summary(hf)}): the config and the weights disagree"
    )
  assert set(flat) == set(expected), sorted(set(flat) ^ set(expected))
  return fields, _nest(flat)


def _placer(c: ModelConfig, mesh, rules):
  """(path, numpy array) -> the array on `mesh`, sharded as the rules say for that parameter."""
  import jax

  from transformers_jax.models import param_shardings

  shardings = flatten(param_shardings(c.unrolled(), mesh, rules))
  return lambda path, array: jax.device_put(array, shardings[path])


def _take(tensors: TensorFiles, name: str, directory, architecture: str) -> np.ndarray:
  """Read tensor `name` (and forget it), refusing values that are not floating-point numbers
  (every tensor a model maps is a weight) and NaN or infinite ones."""
  import jax.numpy as jnp

  try:
    array = tensors.pop(name)
  except UnreadableFile as e:
    raise _unreadable(e.path, e) from None
  # jnp.floating counts bfloat16 and the float8 types too (numpy's np.floating does not)
  if not jnp.issubdtype(array.dtype, jnp.floating):
    raise CorruptCheckpoint(
        f"{directory}: tensor {_full_name(name, architecture)} holds {array.dtype} values: a "
        "weight is read from floating-point values only (float32, float16, bfloat16; "
        "quantized integer weights are not read): use the model's floating-point checkpoint"
    )
  if not np.all(np.isfinite(array)):
    raise CorruptCheckpoint(
        f"{directory}: tensor {_full_name(name, architecture)} holds NaN or infinite values: "
        "the checkpoint is damaged or diverged; use another one"
    )
  return array


def _config_key(error: ValueError, fields: Mapping, raw: Mapping) -> str:
  """'<config.json key>=<value> gives ' for the field a ModelConfig error names, when exactly
  one config.json entry holds that very value; else ''."""
  found = re.match(r"model\.(\w+)=", str(error))
  if not found or found.group(1) not in fields:
    return ""
  value = fields[found.group(1)]
  keys = [k for k, v in raw.items() if v is value]
  return f"{keys[0]}={value!r} gives " if len(keys) == 1 else ""


def _full_name(name: str, architecture: str) -> str:
  """A tensor name as `architecture` stores it (head tensors carry no base prefix)."""
  if name.startswith(("lm_head.", "cls.", "classifier.")):
    return name
  return FAMILY_OF[architecture].base_prefix.get(architecture, "") + name
