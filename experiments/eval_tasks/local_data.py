"""The data of the tasks in this folder: JSON Lines files beside this file, read into a Hugging
Face `datasets` split (nothing is downloaded). A task names its file in `dataset_kwargs`:

    custom_dataset: !function local_data.load
    dataset_kwargs:
      file: pysyntax_choice.jsonl
"""

import json
import pathlib


def load(file: str, split: str = "test", **metadata):
  """{split: the rows of `file` (one JSON object a line, beside this module)}; `metadata` is what
  lm-eval passes along (the task's version and the like), unused."""
  import datasets

  lines = (pathlib.Path(__file__).parent / file).read_text().splitlines()
  rows = [json.loads(line) for line in lines if line.strip()]
  return datasets.DatasetDict({split: datasets.Dataset.from_list(rows)})
