"""The lesson's positional-encoding experiments, computed with this project's own code.

    python scripts/lesson_positions.py

1. The sinusoid table for positions 0-5 (d_model 8) and the dot product of position 10 with
   positions further away (d_model 16), printed in the lesson's exact format, from
   `modules.positions.sinusoidal_table`.
2. RoPE's relative scores: a query and key rotated by `modules.positions.apply_rope` score the
   same for the same offset wherever they sit, and the score falls with distance.
3. Without positions a shuffled sentence gets the same attention weights: "dog bites man" and
   "man bites dog" in one attention head (weights only permuted), then with sinusoids added
   (weights change), then through the project's encoder (`positions=none`: every word's output is
   the same in both orders; learned positions: it is not).
"""

from __future__ import annotations

import math

import numpy as np

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)  # no flags of its own: --help prints the docstring

GAPS = (0, 1, 2, 4, 8, 16)


def sinusoid_rows(positions=range(6), d_model: int = 8) -> list[list[float]]:
  from transformers_jax.modules.positions import sinusoidal_table

  return sinusoidal_table(max(positions) + 1, d_model)[list(positions)].tolist()


def sinusoid_dots(at: int = 10, d_model: int = 16, gaps=GAPS) -> list[float]:
  from transformers_jax.modules.positions import sinusoidal_table

  table = sinusoidal_table(at + max(gaps) + 1, d_model).astype(np.float64)
  return [float(table[at] @ table[at + g]) for g in gaps]


def rope_score(m: int, n: int, q, k, theta: float = 10000.0) -> float:
  """q rotated to position m, dotted with k rotated to position n (one head, float32)."""
  import jax.numpy as jnp
  from transformers_jax.modules.positions import apply_rope

  qm = apply_rope(jnp.asarray(q, jnp.float32)[None, None, None], jnp.array([[m]]), theta)
  kn = apply_rope(jnp.asarray(k, jnp.float32)[None, None, None], jnp.array([[n]]), theta)
  return float(jnp.sum(qm * kn))


def rope_formula(gap: int, head_dim: int = 16, theta: float = 10000.0) -> float:
  """q = k = ones: each of the head_dim/2 rotated pairs contributes 2 cos(gap * theta^(-2i/K))."""
  return sum(2 * math.cos(gap * theta ** (-2 * i / head_dim)) for i in range(head_dim // 2))


def print_sinusoids() -> None:
  print("pos  " + " ".join(f"{'d' + str(i):>5}" for i in range(8)))
  for pos, row in enumerate(sinusoid_rows()):
    print(f"{pos:3}  " + " ".join(f"{v:5.2f}" for v in row))
  print()
  for gap, sim in zip(GAPS, sinusoid_dots()):
    print(f"position 10 against position {10 + gap:2}: dot product {sim:5.2f}")


def print_rope(head_dim: int = 16) -> None:
  ones = np.ones(head_dim)
  print(
      f"RoPE (head_dim {head_dim}, theta 10000), query = key = ones: the score depends only on "
      "the offset"
  )
  print("offset  from 10  from 100  from 1000  formula sum 2cos(offset*theta_i)")
  for gap in GAPS:
    scores = [rope_score(p + gap, p, ones, ones) for p in (10, 100, 1000)]
    print(f"{gap:6}  " + "  ".join(f"{s:7.2f}" for s in scores) + f"  {rope_formula(gap):8.2f}")
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=head_dim), rng.normal(size=head_dim)
  spread = max(abs(rope_score(p + 5, p, q, k) - rope_score(5, 0, q, k)) for p in (10, 100, 1000))
  print(f"random q, k: score at offset 5 varies by {spread:.1e} across positions 0-1005")


def attention_weights(x: np.ndarray, wq: np.ndarray, wk: np.ndarray) -> np.ndarray:
  logits = (x @ wq) @ (x @ wk).T / math.sqrt(wq.shape[1])
  e = np.exp(logits - logits.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def print_matrix(words, w) -> None:
  print("        " + " ".join(f"{t:>6}" for t in words))
  for t, row in zip(words, w):
    print(f"{t:>6}  " + " ".join(f"{v:6.3f}" for v in row))


def print_shuffle(d_model: int = 8) -> None:
  from transformers_jax.modules.positions import sinusoidal_table

  rng = np.random.default_rng(7)
  vocab = {"dog": 0, "bites": 1, "man": 2}
  emb = rng.normal(size=(3, d_model))
  wq, wk = rng.normal(size=(d_model, d_model)), rng.normal(size=(d_model, d_model))
  a, b = ["dog", "bites", "man"], ["man", "bites", "dog"]
  pe = sinusoidal_table(3, d_model).astype(np.float64)
  for label, add in (("no positions", 0.0), ("sinusoidal positions added", pe)):
    print(f"attention weights, {label} (row attends to column):")
    wa = attention_weights(emb[[vocab[t] for t in a]] + add, wq, wk)
    wb = attention_weights(emb[[vocab[t] for t in b]] + add, wq, wk)
    print_matrix(a, wa)
    print_matrix(b, wb)
    print(
        f"  'dog' attends to 'man' with {wa[0, 2]:.3f} in the first order and {wb[2, 0]:.3f} "
        "in the second"
    )
    print()
  for positions in ("none", "learned"):
    print(
        f"project encoder, positions={positions}: largest change of a word's output when "
        f"the sentence is reversed: {encoder_shuffle_gap(positions):.1e}"
    )


def encoder_shuffle_gap(positions: str) -> float:
  """Max |h(word in 'dog bites man') - h(same word in 'man bites dog')| through a 2-block encoder."""
  import jax
  from transformers_jax.config import ModelConfig
  from transformers_jax.models import build_model

  c = ModelConfig(
      family="encoder",
      head="mlm",
      positions=positions,
      num_layers=2,
      d_model=32,
      num_heads=4,
      vocab_size=8,
      max_len=8,
      dropout=0.0,
      attention_dropout=0.0,
  )
  model = build_model(c)
  x = np.array([[1, 2, 3]], np.int32)  # dog bites man
  params = model.init(jax.random.PRNGKey(0), x)
  h = np.asarray(model.apply(params, x)["hidden"])
  h_rev = np.asarray(model.apply(params, x[:, ::-1])["hidden"])
  return float(np.abs(h[:, ::-1] - h_rev).max())


def main(argv=None) -> None:
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: this script takes none")
  print_sinusoids()
  print()
  print_rope()
  print()
  print_shuffle()


if __name__ == "__main__":
  cli.run_script(main)
