"""How full the rows of the bundled seq2seq (numbers) data are with and without packing.

    python scripts/packing_density.py [--seq_len 64] [--examples_per_row 8] [--max_number 99999]
        [--steps 20] [--batch_size 32]

Prints one JSON object: for each layout, training examples per row, and the fraction of source
and target positions that hold a real token (the rest is padding the step computes for nothing).
Data only: no model runs.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLAGS = cli.ScriptFlags(__doc__)
_SEQ_LEN = flags.DEFINE_integer(
    "seq_len", 64, "row length (source and target)", lower_bound=1, flag_values=FLAGS
)
_PER_ROW = flags.DEFINE_integer(
    "examples_per_row", 8, "most pairs a packed row holds", lower_bound=1, flag_values=FLAGS
)
_MAX_NUMBER = flags.DEFINE_integer(
    "max_number", 99_999, "largest number translated", lower_bound=1, flag_values=FLAGS
)
_STEPS = flags.DEFINE_integer(
    "steps", 20, "training batches measured", lower_bound=1, flag_values=FLAGS
)
_BATCH = flags.DEFINE_integer("batch_size", 32, "rows per batch", lower_bound=1, flag_values=FLAGS)


def measure(packing: bool, workdir: pathlib.Path) -> dict:
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.tasks import task_data, task_for

  config = load_config_module(str(ROOT / "experiments" / "transformer.py")).get_config("tiny")
  config.model.max_len = max(config.model.max_len, _SEQ_LEN.value)
  config.update_from_flattened_dict(
      {
          "seq_len": _SEQ_LEN.value,
          "batch_size": _BATCH.value,
          "eval_batches": 1,
          "data.packing": packing,
          "data.examples_per_row": _PER_ROW.value,
          "data.max_number": _MAX_NUMBER.value,
      }
  )
  model_cfg = ModelConfig.from_dict(config.model)
  data = task_data(task_for(model_cfg), config, model_cfg, workdir)
  examples = src = tgt = 0
  for step in range(_STEPS.value):
    batch = data.train_batch(step)
    segments = batch.get("src_segments", batch["src_mask"])
    examples += int(segments.max(axis=1).sum())
    src += int(batch["src_mask"].sum())
    tgt += int(batch["tgt_mask"].sum())
  positions = _STEPS.value * _BATCH.value * _SEQ_LEN.value
  return {
      "examples_per_row": examples / (_STEPS.value * _BATCH.value),
      "source_fill": src / positions,
      "target_fill": tgt / positions,
  }


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  with tempfile.TemporaryDirectory() as tmp:
    out = {
        "data": f"numbers digits_to_words up to {_MAX_NUMBER.value:,}",
        "seq_len": _SEQ_LEN.value,
        "max_examples_per_row": _PER_ROW.value,
        "unpacked": measure(False, pathlib.Path(tmp) / "unpacked"),
        "packed": measure(True, pathlib.Path(tmp) / "packed"),
    }
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  cli.run_script(main)
