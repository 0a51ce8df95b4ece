"""LoRA fine-tuning of a Hugging Face GPT-2, exported both ways, checked with transformers and
peft themselves (the `hf` extra: torch, transformers, peft).

A randomly initialised GPT2LMHeadModel is saved, imported (`convert --from_hf`), LoRA-tuned for
a few steps from it (`init_from`, adapters on q, k, v, out and both MLP projections), then
exported merged (`convert --to_hf`) and as a PEFT adapter folder (`--lora=peft`). Prints one
JSON object: the largest relative logit difference of peft's PeftModel (adapter folder on its
base model) and of the merged export, each against this project's adapted model, and how far
the frozen base alone is from it (the adapters must matter); and the same tune on the vocabulary
widened to 300 ids with model.lora_modules_to_save=embed, its PEFT folder loaded by peft onto the
original model resized to 300 ids.

    pip install -e ".[hf]"
    python scripts/check_peft_export.py [--out DIR]
"""

from __future__ import annotations

import json
import pathlib
import tempfile

import numpy as np
from absl import flags, logging

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_string(
    "out",
    None,
    "Folder for the runs and exports (default: a temporary one).",
    flag_values=FLAGS,
)
flags.DEFINE_integer("steps", 5, "LoRA training steps.", lower_bound=1, flag_values=FLAGS)
output_paths.declare(FLAGS, out=output_paths.FOLDER)


def relative(a, b) -> float:
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def check_modules_to_save(root, config, tokens, torch_logits) -> float:
  """The same LoRA tune on the vocabulary widened to 300 ids with lora_modules_to_save=embed
  (GPT-2's head is its embedding): its PEFT folder, loaded by peft onto the original Hugging Face
  model resized to 300 ids, against our adapted model's logits (max relative difference)."""
  import peft
  import transformers

  from transformers_jax.convert import export_hf
  from transformers_jax.models import build_model
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.train.entry import train

  config = config.copy_and_resolve_references()
  config.model.vocab_size, config.model.lora_modules_to_save = 300, "embed"
  train(config, str(root / "widened"))
  export_hf(root / "widened", root / "widened_peft", overwrite=True, lora_as="peft")
  run = Run(root / "widened")
  params, _ = run.load_params()
  ours = np.asarray(build_model(run.model_config()).apply({"params": params}, tokens)["logits"])
  base = transformers.GPT2LMHeadModel.from_pretrained(root / "hf")
  base.resize_token_embeddings(300)  # new rows drawn at random: the saved embedding replaces them
  adapted = torch_logits(peft.PeftModel.from_pretrained(base, root / "widened_peft"))
  return relative(adapted, ours)


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  logging.set_verbosity(logging.WARNING)
  try:
    import peft
    import torch
    import transformers
  except ImportError as e:
    raise UserError(f"this script needs {e.name}: pip install -e '.[hf]'") from None
  import jax

  from transformers_jax.convert import export_hf, import_hf
  from transformers_jax.models import build_model
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.train.entry import train

  root = pathlib.Path(FLAGS.out or tempfile.mkdtemp(prefix="peft_check_"))
  torch.manual_seed(0)
  hf_config = transformers.GPT2Config(
      vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, tie_word_embeddings=True
  )
  transformers.GPT2LMHeadModel(hf_config).save_pretrained(root / "hf")
  import_hf(root / "hf", root / "base")
  words = np.random.default_rng(0).choice(["alpha", "beta", "gamma", "delta", "eps"], 20_000)
  (root / "corpus.txt").write_text(" ".join(words))
  config = Run(root / "base").config()
  config.update_from_flattened_dict(
      {
          "steps": FLAGS.steps,
          "batch_size": 8,
          "seq_len": 32,
          "eval_every": 0,
          "checkpoint_every": FLAGS.steps,
          "warmup_steps": 0,
          "learning_rate": 1e-2,
          "data.path": str(root / "corpus.txt"),
          "init_from": str(root / "base"),
          "model.lora_rank": 4,
          "model.lora_alpha": 8.0,
          "model.lora_targets": "q,k,v,out,mlp_in,mlp_out",
      }
  )
  train(config, str(root / "tuned"))
  export_hf(root / "tuned", root / "merged", overwrite=True)
  export_hf(root / "tuned", root / "peft", overwrite=True, lora_as="peft")

  tokens = np.random.default_rng(1).integers(0, 256, (2, 32))
  run = Run(root / "tuned")
  params, _ = run.load_params()
  apply = jax.jit(lambda p, t: build_model(run.model_config()).apply({"params": p}, t)["logits"])
  ours = np.asarray(apply(params, tokens))

  def torch_logits(model):
    with torch.no_grad():
      return model.eval()(torch.tensor(tokens)).logits.numpy()

  base = transformers.GPT2LMHeadModel.from_pretrained(root / "peft" / "base_model")
  frozen = torch_logits(base)
  with_adapters = torch_logits(peft.PeftModel.from_pretrained(base, root / "peft"))
  merged = torch_logits(transformers.GPT2LMHeadModel.from_pretrained(root / "merged"))
  widened = check_modules_to_save(root, config, tokens, torch_logits)
  print(
      json.dumps(
          {
              "peft_vs_ours_max_relative": relative(with_adapters, ours),
              "merged_vs_ours_max_relative": relative(merged, ours),
              "frozen_base_vs_ours_max_relative": relative(frozen, ours),
              "modules_to_save_peft_on_resized_base_vs_ours_max_relative": widened,
              "peft_version": peft.__version__,
              "transformers_version": transformers.__version__,
          },
          indent=1,
      )
  )


if __name__ == "__main__":
  cli.run_script(main)
