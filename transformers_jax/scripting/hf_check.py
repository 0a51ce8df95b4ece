"""What the scripts that hold our models against transformers on random configs share
(check_deepseek.py, check_llama4.py, check_moe_models.py, check_open_models.py): their flags,
the `hf` extra they need, a random transformers model with every weight shaken, its logits and
greedy tokens, the two ways through our code (load_hf and save_hf in memory; import_hf and
export_hf through a run folder), the figures compared, the loop over configs and the JSON the
scripts print and write. Each script keeps what is its own: how it draws a config, what it
perturbs besides the weights, and what it checks besides.

Everything here imports torch and transformers when called, never at import: the scripts'
--helpfull and their flag errors work without the `hf` extra."""

from __future__ import annotations

import json
import pathlib
import tempfile

import numpy as np
from absl import flags, logging

from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

# A check passes when its greedy tokens equal transformers' and its logits and the export's
# are this close to transformers' (float32).
LOGITS_TOLERANCE, ROUND_TRIP_TOLERANCE = 1e-4, 1e-5


def define_flags(flag_values, *, configs: int, seed: int, types=None) -> None:
  """--configs, --seed and --out (declared an output file, so it is checked before any work);
  with `types` (the model types a script draws), --types and --new_tokens too, and --configs
  counts per model type."""
  per = " per model type" if types else " to check"
  flags.DEFINE_integer(
      "configs", configs, f"Random configs{per}.", lower_bound=1, flag_values=flag_values
  )
  flags.DEFINE_integer(
      "seed", seed, "Seed of the configs and the weights.", flag_values=flag_values
  )
  if types:
    flags.DEFINE_list(
        "types",
        [],
        f"Model types to check (default: all: {', '.join(types)}).",
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "new_tokens", 10, "Greedy tokens compared.", lower_bound=1, flag_values=flag_values
    )
  flags.DEFINE_string(
      "out", None, "Also write every result as one JSON file here.", flag_values=flag_values
  )
  output_paths.declare(flag_values, out=output_paths.FILE)


def require_hf():
  """(torch, transformers), transformers' warnings silenced; one error line without them."""
  try:
    import torch
    import transformers
  except ImportError as e:
    raise UserError(f"this script needs {e.name}: pip install -e '.[hf]'") from None
  logging.set_verbosity(logging.WARNING)
  transformers.logging.set_verbosity_error()
  return torch, transformers


def shaken_model(config_class: str, model_class: str, config: dict, seed: int, **options):
  """transformers' `model_class` built from `config_class(**config, **options)` in eval mode,
  every trainable weight w moved to w + 0.3 N(0, 1), so norms and biases are not their initial
  values. Returns the model and the torch generator drawn from, for what a script shakes
  besides."""
  import torch
  import transformers

  torch.manual_seed(seed)
  hf_config = getattr(transformers, config_class)(**config, **options)
  model = getattr(transformers, model_class)(hf_config).eval()
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      if p.requires_grad:
        p.add_(0.3 * torch.randn(p.shape, generator=generator))
  return model, generator


def hf_logits(model, tokens, decoder_tokens=None) -> np.ndarray:
  """transformers' logits on `tokens` (an encoder-decoder's: on `decoder_tokens` after them)."""
  import torch

  with torch.no_grad():
    if decoder_tokens is None:
      return model(torch.tensor(tokens)).logits.numpy()
    inputs = dict(input_ids=torch.tensor(tokens), decoder_input_ids=torch.tensor(decoder_tokens))
    return model(**inputs).logits.numpy()


def hf_greedy(model, prompt: list[int], new_tokens: int, cached: bool = True) -> np.ndarray:
  """The `new_tokens` tokens transformers' generate decodes greedily after `prompt`, with its
  cache or (cached=False) by its forward passes."""
  import torch

  with torch.no_grad():
    generated = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        use_cache=cached,
    )
  return generated[0, len(prompt) :].numpy()


def max_abs_error(got, want) -> float:
  """The largest |got - want|, `got`'s vocabulary cut to `want`'s (ours may be padded)."""
  return float(np.max(np.abs(np.asarray(got)[..., : np.shape(want)[-1]] - want)))


def our_logits(config, params, *inputs):
  """Our model of `config` with `params` run (compiled) on `inputs`: its logits."""
  import jax

  from transformers_jax.models import build_model

  return jax.jit(build_model(config).apply)({"params": params}, *inputs)["logits"]


def through_load_hf(model, tokens, prompt: list[int], new_tokens: int, scan: bool = False):
  """`model` saved (save_pretrained), read with load_hf (run in the scanned layout with `scan`)
  and compared: logits on `tokens`, `new_tokens` greedy tokens after `prompt` decoded with our
  cache against transformers' generate, the parameter counts, and save_hf -> from_pretrained
  (transformers on what we wrote) reproducing transformers' logits. Returns the fields read and
  the figures."""
  from transformers_jax import decode
  from transformers_jax.config import ModelConfig
  from transformers_jax.interop import load_hf, save_hf
  from transformers_jax.models import counting
  from transformers_jax.modules.block import loop_to_scan

  want = hf_logits(model, tokens)
  greedy = hf_greedy(model, prompt, new_tokens)
  with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(pathlib.Path(tmp) / "hf")
    fields, params = load_hf(pathlib.Path(tmp) / "hf")
    config = ModelConfig(**fields).replace(scan_layers=scan)
    run_params = loop_to_scan(params) if scan else params
    got = our_logits(config, run_params, tokens)
    out = decode.generate(config, run_params, [prompt], new_tokens)
    ours = np.asarray(out.tokens)[0, :new_tokens]
    save_hf(pathlib.Path(tmp) / "ours", fields, params)
    again = hf_logits(type(model).from_pretrained(pathlib.Path(tmp) / "ours").eval(), tokens)
  return fields, {
      "logits_max_abs_error": max_abs_error(got, want),
      "logits_scale": float(np.max(np.abs(want))),
      "greedy_equal": bool(np.array_equal(ours, greedy)),
      "greedy_hf": greedy.tolist(),
      "greedy_ours": ours.tolist(),
      "params_hf": sum(p.numel() for p in model.parameters()),
      "params_ours": counting.count(fields),
      "params_analytic": counting.analytic_count(fields),
      "exported_logits_max_abs_error": max_abs_error(again, want),
  }


def import_run(model, root: pathlib.Path, name: str, scanned: bool):
  """`model` saved as root/name and imported (import_hf, scanned with `scanned`) as the run
  root/name_run: the Run, its model config and its params."""
  from transformers_jax.convert import import_hf
  from transformers_jax.run_folder.runs import Run

  model.save_pretrained(root / name)
  import_hf(root / name, root / f"{name}_run", scan_layers=scanned)
  run = Run(root / f"{name}_run")
  return run, run.model_config(), run.load_params()[0]


def exported_model(model, root: pathlib.Path, name: str, **options):
  """The run root/name_run exported (export_hf) as root/name_out and read back by transformers
  as `model`'s class (from_pretrained with `options`), in eval mode."""
  from transformers_jax.convert import export_hf

  export_hf(root / f"{name}_run", root / f"{name}_out")
  return type(model).from_pretrained(root / f"{name}_out", **options).eval()


def decoder_greedy(model, config, params, prompt: list[int], new_tokens: int):
  """Greedy tokens after `prompt`: ours (decoded with our KV cache), transformers' by its
  forward passes (generate without its cache), and whether its cached generate agrees with
  those. Where transformers' cache parts from its own forward passes (a window of 1, whose
  cache keeps every key), ours is held to the forward passes."""
  from transformers_jax import decode

  cached, uncached = hf_greedy(model, prompt, new_tokens), hf_greedy(
      model, prompt, new_tokens, False
  )
  ours = np.asarray(decode.generate(config, params, [prompt], new_tokens).tokens)[0, :new_tokens]
  return ours, uncached, bool(np.array_equal(cached, uncached))


def greedy_figures(ours, hf_tokens) -> dict:
  """Whether our greedy tokens equal transformers' and how many were compared; where not, both
  and the first position where they part."""
  same = int(np.argmin(np.append(ours[: len(hf_tokens)] == hf_tokens, False)))
  figures = dict(
      greedy_match=bool(same == len(hf_tokens) == len(ours)),
      greedy_tokens_compared=len(hf_tokens),
  )
  if not figures["greedy_match"]:
    figures.update(hf_greedy=hf_tokens.tolist(), ours_greedy=ours.tolist(), parted_at=same)
  return figures


def passed(result: dict) -> bool:
  """Greedy tokens equal, logits and the export's within the tolerances."""
  return bool(
      result["greedy_match"]
      and result["logits_max_abs_error"] < LOGITS_TOLERANCE
      and result["round_trip_max_abs_error"] < ROUND_TRIP_TOLERANCE
  )


def write_checks(checks: list[dict], out: str | None) -> None:
  """Print the checks with the versions of torch and transformers as one JSON object; write
  it to `out` too where given."""
  import torch
  import transformers

  versions = {"torch": torch.__version__, "transformers": transformers.__version__}
  text = json.dumps({**versions, "checks": checks}, indent=1)
  print(text)
  if out:
    pathlib.Path(out).write_text(text + "\n")


def check_types(types, flag_values, check, prefix: str) -> list[dict]:
  """check(model_type, index, rng, seed, root) for --configs configs of each model type of
  --types (default: every one of `types`), each with its own draws: rng from (--seed, the
  type's place among `types` sorted, index), seed --seed * 1000 + index, and a scratch folder
  root. A check that raises is recorded as an error, not fatal. Prints each result as a JSON
  line and returns them."""
  unknown = sorted(set(flag_values.types) - set(types))
  if unknown:
    raise UserError(f"--types: no model type {unknown[0]}; the types are {', '.join(types)}")
  require_hf()
  results = []
  with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
    for model_type in flag_values.types or types:
      for index in range(flag_values.configs):
        rng = np.random.default_rng([flag_values.seed, sorted(types).index(model_type), index])
        seed = flag_values.seed * 1000 + index
        try:
          result = check(model_type, index, rng, seed, pathlib.Path(tmp))
        except Exception as e:  # noqa: BLE001  (a refusal or a failure: recorded, not fatal)
          result = dict(model_type=model_type, index=index, error=f"{type(e).__name__}: {e}")
          result.update(ok=False, logits_max_abs_error=None, round_trip_max_abs_error=None)
        print(json.dumps(result), flush=True)
        results.append(result)
  return results


def _worst(results, model_type, key):
  values = [r[key] for r in results if r["model_type"] == model_type and r.get(key) is not None]
  return max(values) if values else None


def write_summary(results: list[dict], out: str | None) -> None:
  """Print a summary per model type (configs, how many passed, the worst logit and export
  errors) with the versions of torch and transformers; write it and every result to `out`
  where given."""
  import torch
  import transformers

  summary = {
      t: {
          "configs": sum(r["model_type"] == t for r in results),
          "ok": sum(r["ok"] for r in results if r["model_type"] == t),
          "worst_logits_error": _worst(results, t, "logits_max_abs_error"),
          "worst_round_trip_error": _worst(results, t, "round_trip_max_abs_error"),
      }
      for t in dict.fromkeys(r["model_type"] for r in results)
  }
  versions = dict(torch=torch.__version__, transformers=transformers.__version__)
  print(json.dumps({"summary": summary, **versions}, indent=1))
  if out:
    pathlib.Path(out).write_text(
        json.dumps({"summary": summary, **versions, "results": results}, indent=1) + "\n"
    )
