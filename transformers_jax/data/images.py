"""Image classification data: scikit-learn's bundled 8x8 digits, or a user ``.npz``.

Images are float32 [N, H, W, C] in [0, 1] (for uint8 input) and labels int32 [N].
"""

from __future__ import annotations

import functools
import os
import pathlib

import numpy as np

from transformers_jax.data.errors import DataError
from transformers_jax.data.sampling import epoch_indices, eval_index_batches

DIGITS_VAL_FRACTION = 0.2
SPLITS = ("train", "validation")


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
  from sklearn.datasets import load_digits  # reads files shipped inside scikit-learn

  data = load_digits()
  images = (data.images / 16.0).astype(np.float32)[..., None]
  return images, data.target.astype(np.int32)


def digits_dataset(split: str) -> tuple[np.ndarray, np.ndarray]:
  """(images [N, 8, 8, 1] float32 in [0, 1], labels [N] int32) of 1797 digits, 10 classes.

  The split is fixed: a seed-0 permutation, the last 20% is validation.
  """
  if split not in SPLITS:
    raise DataError(f"unknown image split {split!r}: use one of {SPLITS}")
  images, labels = _digits()
  perm = np.random.default_rng(0).permutation(len(labels))
  num_val = round(len(labels) * DIGITS_VAL_FRACTION)
  idx = perm[-num_val:] if split == "validation" else perm[:-num_val]
  return images[idx], labels[idx]


def load_npz(
    path: str | os.PathLike, num_classes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """Arrays ``images`` ([N,H,W] or [N,H,W,C]; uint8 is scaled to [0,1], floats kept) and ``labels`` ([N] ints)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise DataError(
        f"image file '{path}' does not exist: pass an .npz with arrays 'images' and 'labels'"
    )
  fix = "save it with np.savez(path, images=..., labels=...)"
  with open(path, "rb") as head:
    magic = head.read(6)
  if not magic.startswith((b"PK\x03\x04", b"\x93NUMPY")):  # a zip (.npz) or one .npy array
    raise DataError(
        f"'{path}' is not an .npz archive (an image task reads arrays 'images' and 'labels' "
        f"from one): {fix}"
    )
  try:
    f = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise DataError(f"cannot read '{path}' as .npz ({e}): {fix}") from e
  if not isinstance(f, np.lib.npyio.NpzFile):
    raise DataError(f"'{path}' holds a single array, not an .npz archive: {fix}")
  with f:
    missing = {"images", "labels"} - set(f.files)
    if missing:
      raise DataError(f"'{path}' lacks array(s) {sorted(missing)} (has {sorted(f.files)}): {fix}")
    images, labels = (_read_array(f, name, path) for name in ("images", "labels"))
  if images.ndim == 3:
    images = images[..., None]
  if images.ndim != 4 or len(images) == 0:
    raise DataError(
        f"'{path}' images have shape {images.shape}: use a non-empty [N,H,W] or [N,H,W,C] array"
    )
  if images.dtype == np.uint8:
    images = images.astype(np.float32) / 255.0
  elif np.issubdtype(images.dtype, np.floating):
    images = images.astype(np.float32)
    bad = np.argwhere(~np.isfinite(images))
    if bad.size:
      raise DataError(
          f"'{path}' image {int(bad[0][0])} holds NaN or infinite pixels: clean or drop it"
      )
  else:
    raise DataError(f"'{path}' images have dtype {images.dtype}: use uint8 (0..255) or float")
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise DataError(
        f"'{path}' labels have shape {labels.shape} and dtype {labels.dtype}: use a 1-D integer array"
    )
  if len(labels) != len(images):
    raise DataError(
        f"'{path}' has {len(images)} images but {len(labels)} labels: give one label per image"
    )
  if num_classes is not None:
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.size:
      raise DataError(
          f"'{path}' has label {int(bad[0])} outside [0, num_classes={num_classes}): "
          "fix the labels or raise --config.model.num_classes"
      )
  return images, labels.astype(np.int32)


def _read_array(archive, name: str, path: pathlib.Path) -> np.ndarray:
  """Array `name` of an .npz, or one line when it holds Python objects, which are stored
  pickled: this project never unpickles a file (np.load's allow_pickle=False)."""
  try:
    return archive[name]
  except ValueError as e:
    if "allow_pickle" not in str(e):
      raise DataError(f"cannot read array {name!r} of '{path}' ({e})") from None
    raise DataError(
        f"'{path}' array {name!r} holds Python objects (dtype=object: ragged images, or "
        "labels as strings), which are stored pickled and never loaded here: save numbers, "
        f"e.g. np.savez(path, images=np.stack(images).astype(np.uint8), labels=np.asarray("
        "labels, np.int64))"
    ) from None


class ImageBatches:
  """Images and labels; ``batch`` is a pure function of (seed, step), one permutation per epoch."""

  def __init__(self, images: np.ndarray, labels: np.ndarray):
    if len(images) != len(labels) or len(images) == 0:
      raise DataError(
          f"ImageBatches got {len(images)} images and {len(labels)} labels: give one label per image"
      )
    self.images, self.labels = images, labels

  def __len__(self) -> int:
    return len(self.labels)

  def batch(
      self, step: int, batch_size: int, seed: int, rows: slice = slice(None)
  ) -> dict[str, np.ndarray]:
    """The batch of `step`; with `rows`, only those rows of it are read."""
    idx = epoch_indices(len(self), step, batch_size, seed)[rows]
    return {"images": self.images[idx], "labels": self.labels[idx]}

  def eval_batches(self, batch_size: int) -> list[dict[str, np.ndarray]]:
    """The whole split in order; ``weights`` is 0 on the padding of the last batch."""
    return [
        {"images": self.images[idx], "labels": self.labels[idx], "weights": w}
        for idx, w in eval_index_batches(len(self), batch_size)
    ]
