"""Index helpers shared by the example-level batchers (images, seq2seq pairs)."""

from __future__ import annotations

import numpy as np


def epoch_indices(n: int, step: int, batch_size: int, seed: int) -> np.ndarray:
  """Indices of batch ``step``: consecutive slices of one permutation per epoch.

  Depends only on (n, seed, step, batch_size); every example is seen once per epoch.
  """
  flat = step * batch_size + np.arange(batch_size)
  epochs, pos = np.divmod(flat, n)
  out = np.empty(batch_size, dtype=np.int64)
  for e in np.unique(epochs):
    sel = epochs == e
    out[sel] = np.random.default_rng([seed, int(e)]).permutation(n)[pos[sel]]
  return out


def eval_index_batches(n: int, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """(indices, weights) covering 0..n-1 in order; the last batch is padded with index 0, weight 0."""
  out = []
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size)
    weights = (idx < n).astype(np.float32)
    out.append((np.where(idx < n, idx, 0), weights))
  return out
