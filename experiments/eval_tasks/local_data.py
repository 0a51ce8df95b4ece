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
  lm-eval passes along (the task's version and the like), unused. A file without examples, or
  with a line that is not a JSON object, is a ValueError naming the file (and the line)."""
  import datasets

  path = pathlib.Path(__file__).parent / file
  rows = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError:
      row = None  # not JSON: refused below, like JSON that is not an object
    if not isinstance(row, dict):
      raise ValueError(
          f"{path} line {number} is not a JSON object ({line[:40]!r}): write one example a "
          "line, as {...}"
      )
    rows.append(row)
  if not rows:  # (lm-eval would stop at an IndexError when it looks at the first example)
    raise ValueError(
        f"{path} holds no examples: write one JSON object a line, or leave its task out"
    )
  return datasets.DatasetDict({split: datasets.Dataset.from_list(rows)})
