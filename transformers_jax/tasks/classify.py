"""One label per example: text classification (encoder with the classifier head) and image
classification (ViT)."""

from __future__ import annotations

import numpy as np

from transformers_jax import data as D
from transformers_jax.tasks.base import Task, TaskData
from transformers_jax.tasks.text_data import run_tokenizer, split_rows


class TextClassification(Task):
  """Bundled: is a window of text Python source (0) or pydoc documentation (1)?
  User data: a TSV of `text<TAB>label` with integer labels."""

  name = "classify_text"
  summary = "one label per text (encoder, head classifier)"
  families, heads = ("encoder",), ("classifier",)
  bundled_data = "corpus_kind"
  packs = "examples"

  def batch_shapes(self, model_cfg, config):
    B, T = config.batch_size, config.seq_len
    if config.data.packing:  # up to K = data.examples_per_row examples per row, one label each
      K = config.data.examples_per_row
      return {
          "tokens": ((B, T), np.int32),
          "segment_ids": ((B, T), np.int32),
          "positions": ((B, T), np.int32),
          "starts": ((B, K), np.int32),  # each example's first ([CLS]) token, pooled
          "labels": ((B, K), np.int32),
          "weights": ((B, K), np.float32),  # 0 on the empty slots
      }
    return {
        "tokens": ((B, T), np.int32),
        "attention_mask": ((B, T), np.int32),
        "labels": ((B,), np.int32),
        "weights": ((B,), np.float32),
    }

  def outputs(self, model, variables, batch, rngs, mutable):
    if "segment_ids" in batch:  # packed rows: logits [B, K, classes], one per example slot
      out, state = model.apply(
          variables,
          batch["tokens"],
          positions=batch["positions"],
          segment_ids=batch["segment_ids"],
          pool_starts=batch["starts"],
          rngs=rngs,
          mutable=mutable,
      )
      return (out["logits"], batch["labels"], batch["weights"]), state
    out, state = model.apply(
        variables, batch["tokens"], batch["attention_mask"], rngs=rngs, mutable=mutable
    )
    return (out["logits"], batch["labels"], batch["weights"]), state

  def synthetic_batch(self, model_cfg, config, seed: int = 0):
    out = super().synthetic_batch(model_cfg, config, seed)
    if config.data.packing:  # one whole-row example per row: a layout the model can take
      out["starts"] = np.zeros_like(out["starts"])
      out["labels"] = out["labels"] % model_cfg.num_classes
      out["weights"][:, 1:] = 0
    return out

  def data(self, config, model_cfg, workdir):
    B, T, seed = config.batch_size, config.seq_len, config.seed
    if config.data.path:
      rows = D.load_tsv_pairs(config.data.path, columns="text<TAB>label")
      try:
        labelled = [(text, int(label)) for text, label in rows]
      except ValueError:
        raise D.DataError(
            f"data.path '{config.data.path}': labels must be integers " "(text<TAB>label per line)"
        ) from None
      train_idx, val_idx = split_rows(len(labelled), config.data.path)
      docs_train = [labelled[i] for i in train_idx]
      docs_val = [labelled[i] for i in val_idx]
      summary = f"{len(labelled)} labelled texts from {config.data.path}"
    else:
      corpus = D.build_corpus(config.data.max_bytes)
      docs_train = [(t, int(n.startswith("pydoc/"))) for n, t in corpus.train_docs]
      docs_val = [(t, int(n.startswith("pydoc/"))) for n, t in corpus.val_docs]
      summary = (
          "corpus_kind: Python source (0) vs pydoc text (1), "
          f"{len(docs_train)} train / {len(docs_val)} validation documents"
      )
    tok = run_tokenizer(config, model_cfg, workdir, [t for t, _ in docs_train], specials=True)
    labels = sorted({y for _, y in docs_train + docs_val})
    if labels[0] < 0 or labels[-1] >= model_cfg.num_classes:
      raise D.DataError(
          f"labels span {labels[0]}..{labels[-1]} but model.num_classes="
          f"{model_cfg.num_classes}: set --config.model.num_classes"
      )

    def window(text, rng):
      """[CLS] and up to T - 1 tokens of `text`, from a random start (the first with no rng)."""
      ids = tok.encode(text)
      start = int(rng.integers(0, max(1, len(ids) - (T - 1)))) if rng is not None else 0
      return [tok.cls_id, *ids[start : start + T - 1]]

    def encode(texts_and_labels, rngs):
      """One row per example; example i's window drawn from rngs[i]."""
      tokens = np.full((len(texts_and_labels), T), tok.pad_id, np.int32)
      for i, ((text, _), rng) in enumerate(zip(texts_and_labels, rngs)):
        w = window(text, rng)
        tokens[i, : len(w)] = w
      return {
          "tokens": tokens,
          "attention_mask": (tokens != tok.pad_id).astype(np.int32),
          "labels": np.array([y for _, y in texts_and_labels], np.int32),
          "weights": np.ones(len(texts_and_labels), np.float32),
      }

    by_label = {y: [d for d in docs_train if d[1] == y] for y in labels}
    by_label = {y: ds for y, ds in by_label.items() if ds}
    present = sorted(by_label)
    K = config.data.examples_per_row

    def pick(rng):
      """A training example: a label drawn uniformly, then one of its texts."""
      y = present[int(rng.integers(len(present)))]
      return by_label[y][int(rng.integers(len(by_label[y])))]

    def packed_row(rng):
      """Up to K examples packed into one row, each drawn as an unpacked row draws one; of K
      draws, one that does not fit what is left is passed over, and a full row stops early."""
      taken, room = [], T
      for _ in range(K):
        text, y = pick(rng)
        w = window(text, rng)
        if len(w) <= room:
          taken.append((w, y))
          room -= len(w)
        if room < 2:  # no room for [CLS] and a token
          break
      tokens, segments, positions, starts = D.pack_sequences([w for w, _ in taken], T, tok.pad_id)
      labels_k, weights_k = np.zeros(K, np.int32), np.zeros(K, np.float32)
      labels_k[: len(taken)], weights_k[: len(taken)] = [y for _, y in taken], 1.0
      starts_k = np.zeros(K, np.int32)
      starts_k[: len(taken)] = starts
      return {
          "tokens": tokens,
          "segment_ids": segments,
          "positions": positions,
          "starts": starts_k,
          "labels": labels_k,
          "weights": weights_k,
      }

    def train_rows(step, start, stop):
      """Rows [start, stop) of the batch of `step`: row r draws from its own (seed, step, r)
      stream, so any rows are built without the others."""
      rngs = [np.random.default_rng([seed, step, r]) for r in range(start, stop)]
      if config.data.packing:
        rows = [packed_row(rng) for rng in rngs]
        return {k: np.stack([row[k] for row in rows]) for k in rows[0]}
      return encode([pick(rng) for rng in rngs], rngs)

    rng = np.random.default_rng([seed, 10**6])
    val = [docs_val[i % len(docs_val)] for i in range(B * config.eval_batches)]
    evals = [encode(val[i : i + B], [rng] * B) for i in range(0, len(val), B)]
    if config.data.packing:  # held-out examples one per row, in the layout the step takes
      evals = [D.classify_one_per_row(b, K) for b in evals]
    return TaskData(lambda step: train_rows(step, 0, B), evals, tok, summary, train_rows=train_rows)


class ImageClassification(Task):
  """Bundled: scikit-learn's 8x8 digits. User data: an .npz with `images` and `labels`."""

  name = "classify_image"
  summary = "one label per image (vit, head classifier)"
  families, heads = ("vit",), ("classifier",)
  bundled_data = "digits"
  reads_seq_len = False

  def batch_shapes(self, model_cfg, config):
    B, size, ch = config.batch_size, model_cfg.image_size, model_cfg.num_channels
    return {
        "images": ((B, size, size, ch), np.float32),
        "labels": ((B,), np.int32),
        "weights": ((B,), np.float32),
    }

  def tokens_per_example(self, model_cfg, config):
    return model_cfg.seq_len_max  # patches (and the class token)

  def outputs(self, model, variables, batch, rngs, mutable):
    out, state = model.apply(variables, batch["images"], rngs=rngs, mutable=mutable)
    return (out["logits"], batch["labels"], batch["weights"]), state

  def data(self, config, model_cfg, workdir):
    B, seed = config.batch_size, config.seed
    if config.data.path:
      images, labels = D.load_npz(config.data.path, model_cfg.num_classes)
      if images.ndim == 3:
        images = images[..., None]
      order = np.random.default_rng(0).permutation(len(labels))
      cut = max(1, len(labels) // 10)
      val_idx, train_idx = order[:cut], order[cut:]
      if not len(train_idx):
        raise D.DataError(
            f"data.path '{config.data.path}' holds {len(labels)} image(s): give "
            "at least 2, one of which is held out for validation"
        )
      train = (images[train_idx], labels[train_idx])
      val = (images[val_idx], labels[val_idx])
      summary = f"{len(labels)} images from {config.data.path}"
    else:
      train, val = D.digits_dataset("train"), D.digits_dataset("validation")
      summary = f"sklearn digits: {len(train[1])} train / {len(val[1])} validation images"
    expected = (model_cfg.image_size, model_cfg.image_size, model_cfg.num_channels)
    if tuple(train[0].shape[1:]) != expected:
      raise D.DataError(
          f"images are {tuple(train[0].shape[1:])} but the model expects "
          f"{expected}: set model.image_size / model.num_channels to match"
      )
    if int(train[1].max()) >= model_cfg.num_classes:
      raise D.DataError(
          f"labels reach {int(train[1].max())} but model.num_classes="
          f"{model_cfg.num_classes}: raise model.num_classes"
      )
    train_b, val_b = D.ImageBatches(*train), D.ImageBatches(*val)

    def train_rows(step, start, stop):
      rows = train_b.batch(step, B, seed, slice(start, stop))
      return {**rows, "weights": np.ones(stop - start, np.float32)}

    return TaskData(
        lambda step: train_rows(step, 0, B),
        val_b.eval_batches(B)[: config.eval_batches],
        None,
        summary,
        train_rows=train_rows,
    )
